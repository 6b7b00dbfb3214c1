"""WAGLE and Selective Pruning on real models: the trainer contract on the tiny memorizing model (out-of-mask scalars
bit-identical in the saved checkpoint, AND with ``restrict=``, LoRA refused), the Hydra app, and both methods on the
smoke testbed (forget NLL up, leak down). Closed forms on hand-made tensors: tests/unlearn/methods/test_methods_wagle_sp.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lacuna_unlearn.methods import make_method
from lacuna_unlearn.methods.selective_pruning import (
    SPConfig,
)
from lacuna_unlearn.methods.wagle import WAGLE
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LACUNA_CACHE=str(cwd / "cache"))  # never touch ~/.cache from tests
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, check=False)


# -- WAGLE on the tiny memorizing model ------------------------------------------------------------------------

WAGLE_ARGS = {"ratio": 0.2, "mu": 1e-3, "batch_size": 2}


def _datasets(model_dir, rows):
    from transformers import AutoTokenizer

    from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain

    tok = AutoTokenizer.from_pretrained(model_dir)
    forget, retain = rows
    return (
        QADataset(forget, tok, name="forget"),
        QADataset(retain, tok, name="retain"),
        collate_forget_retain(tok.pad_token_id),
    )


def _load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)


def test_locate_matches_a_backward_reference(tiny_lacuna, tiny_email_rows) -> None:
    """The located mask = top-k of |(w - g_r/mu) g_f|, g accumulated by .backward() over batches of 2 in order."""
    from lacuna_unlearn.methods.losses import nll_loss

    model = _load(tiny_lacuna.model_dir)
    forget, retain, collate = _datasets(tiny_lacuna.model_dir, tiny_email_rows)
    located = WAGLE(**WAGLE_ARGS).locate(model, forget, retain, collate)
    names = [n for n in dict(model.named_parameters()) if n.startswith("model.layers.") and n.endswith("proj.weight")]
    assert list(located) == names and len(names) == 14  # 7 projections x 2 blocks; no embeddings / norms / lm_head

    def grads(items, hf_loss=False):
        model.zero_grad()
        for start in range(0, len(items), 2):
            batch = collate([{"forget": it} for it in items[start : start + 2]])["forget"]
            if hf_loss:  # HF's own mean CE over the labelled (answer) tokens
                model(**batch).loss.backward()
            else:
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                nll_loss(out.logits, batch["labels"]).backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if n in names}

    g_f = grads([forget[i] for i in range(len(forget))])
    g_r = grads([retain[i % len(retain)] for i in range(len(forget))])
    params = dict(model.named_parameters())
    scores = torch.cat([((params[n].detach() - g_r[n] / 1e-3) * g_f[n]).abs().reshape(-1) for n in names])
    k = int(0.2 * scores.numel())
    reference = torch.zeros(scores.numel(), dtype=torch.bool)
    reference[scores.argsort(descending=True, stable=True)[:k]] = True
    assert torch.equal(torch.cat([located[n].reshape(-1) for n in names]), reference)
    # the loss is the one HF trains with (up to rounding: ~1e-4 relative on these tiny, memorized losses)
    hf = grads([forget[i] for i in range(len(forget))], hf_loss=True)
    for n in names:
        assert (hf[n] - g_f[n]).abs().max() <= 1e-2 * g_f[n].abs().max(), n


def test_wagle_unlearn_moves_only_located_scalars(tiny_lacuna, tiny_email_rows, forget_nll, tmp_path) -> None:
    from safetensors.torch import load_file

    forget_rows, retain_rows = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir, forget_rows, retain_rows, make_method("wagle", **WAGLE_ARGS), tmp_path / "wagle",
        train=TrainConfig(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=2, weight_decay=0.01),
        method_name="wagle",
    )  # fmt: skip
    original = _load(tiny_lacuna.model_dir)
    located = WAGLE(**WAGLE_ARGS).locate(original, *_datasets(tiny_lacuna.model_dir, tiny_email_rows))
    after = load_file(str(out / "model.safetensors"))
    moved = selected = 0
    for name, param in original.named_parameters():
        old, new = param.detach(), after[name]
        keep = located.get(name)
        if keep is None:  # embeddings, norms, lm_head: not candidates, frozen
            assert torch.equal(new, old), name
            continue
        assert torch.equal(new[~keep], old[~keep]), name
        moved += int((new[keep] != old[keep]).sum())
        selected += int(keep.sum())
    assert moved > 0.5 * selected
    assert forget_nll(out, forget_rows) > forget_nll(tiny_lacuna.model_dir, forget_rows) + 0.5
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "wagle" and manifest["located"]["parameters"] == 14
    assert manifest["located"]["selected_scalars"] == sum(manifest["located"]["selected_per_parameter"].values())
    assert manifest["out_of_mask_unchanged"] is True and manifest["method_args"]["ratio"] == 0.2
    assert manifest["restriction"]["trainable_scalars"] == selected


def test_wagle_composes_with_restrict_forget_mask(tiny_lacuna, tiny_email_rows, tmp_path) -> None:
    from safetensors.torch import load_file

    from lacuna_metrics.masks import build_masks, named_shapes_of

    original = _load(tiny_lacuna.model_dir)
    masks = build_masks(named_shapes_of(original), original.config.num_hidden_layers, budget=0.06, seed=0, skip_last=0)
    forget_rows, retain_rows = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir, forget_rows, retain_rows, make_method("wagle", **WAGLE_ARGS), tmp_path / "w+m",
        train=TrainConfig(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=2),
        restrict="forget_mask", masks=masks,
    )  # fmt: skip
    located = WAGLE(**WAGLE_ARGS).locate(original, *_datasets(tiny_lacuna.model_dir, tiny_email_rows))
    after = load_file(str(out / "model.safetensors"))
    moved = both = 0
    for name, param in original.named_parameters():
        old, new = param.detach(), after[name]
        if name not in located or name not in masks.packed:
            assert torch.equal(new, old), name
            continue
        keep = located[name] & masks.forget_mask(name)  # AND of the localisation and restrict=
        assert torch.equal(new[~keep], old[~keep]), name
        moved += int((new[keep] != old[keep]).sum())
        both += int(keep.sum())
    assert 0 < moved <= both
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["restrict"] == "forget_mask" and manifest["restriction"]["trainable_scalars"] == both


def test_wagle_refuses_lora(tiny_lacuna, tiny_email_rows, tmp_path) -> None:
    from lacuna_unlearn.lora import LoraSettings

    forget_rows, retain_rows = tiny_email_rows
    with pytest.raises(ValueError, match="LoRA"):
        unlearn(
            tiny_lacuna.model_dir, forget_rows, retain_rows, make_method("wagle"), tmp_path / "x",
            train=TrainConfig(max_steps=1), lora=LoraSettings(),
        )  # fmt: skip
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_wagle_hydra_app(tiny_lacuna, tmp_path) -> None:
    out = tmp_path / "wagle_npo"
    common = (f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email")
    proc = _app(
        "method=wagle", *common, f"output_dir={out}", "method.args.objective=npo", "method.args.ratio=0.3",
        "trainer.args.learning_rate=3e-3", "trainer.args.max_steps=2", "trainer.args.per_device_train_batch_size=2",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "wagle" and manifest["method_args"]["objective"] == "npo"
    assert manifest["located"]["parameters"] == 14 and manifest["out_of_mask_unchanged"] is True
    block_linears = 2 * (4 * 64 * 64 + 3 * 64 * 128)  # q/k/v/o 64x64, gate/up/down 64x128, in 2 blocks
    assert manifest["restriction"]["trainable_scalars"] == int(0.3 * block_linears)
    proc = _app("method=wagle", *common, f"output_dir={tmp_path / 'bad'}", "method.args.ratio=0", cwd=tmp_path)
    assert proc.returncode == 2 and "WAGLE.ratio" in proc.stderr and not (tmp_path / "bad").exists()


# -- Selective Pruning end to end ------------------------------------------------------------------------------


def test_sp_hydra_app_writes_a_checkpoint_and_manifest(tiny_lacuna, tmp_path) -> None:
    out = tmp_path / "sp"
    common = (f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email")
    args = ("method.args.calib_samples=8", "method.args.max_length=64", "method.args.frac=0.1")
    proc = _app("method=selective_pruning", *common, f"output_dir={out}", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "selective_pruning" and manifest["config"]["frac"] == 0.1
    assert manifest["calibration"]["activation_fingerprint"].startswith("sha256:")
    assert manifest["neurons_total"] == 2 * 128 and manifest["pruned_total"] == int(0.1 * 256)
    model, original = _load(out), _load(tiny_lacuna.model_dir)
    new, old = model.state_dict(), original.state_dict()
    for name, value in new.items():
        if name in manifest["zeroed"]:
            down = name.replace("gate_proj", "down_proj").replace("up_proj", "down_proj")
            dead = manifest["neurons"][down]
            if "down_proj" in name:
                assert (value[:, dead] == 0).all() and set(manifest["neurons"]) >= {name}
            else:
                assert (value[dead, :] == 0).all()
            assert int((value != old[name]).any(dim=0 if "down_proj" in name else 1).sum()) <= len(dead)
        else:
            assert torch.equal(value, old[name]), name
    assert list(tmp_path.glob("cache/activations/*.safetensors"))  # shared FRAG/FRP statistics cache

    proc = _app(
        "method=selective_pruning", *common, f"output_dir={tmp_path / 'bad'}", "method.args.frac=1.5", cwd=tmp_path
    )
    assert proc.returncode == 2 and "SPConfig.frac" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "bad").exists()


def test_sp_unknown_argument_is_named(tiny_lacuna, tmp_path) -> None:
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.trainer.app import run

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(
            config_name="unlearn",
            overrides=[
                "method=selective_pruning", f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}",
                f"output_dir={tmp_path / 'x'}", "+method.args.nope=1",
            ],
        )  # fmt: skip
    with pytest.raises(ValueError, match="nope"):
        run(cfg)
    assert not (tmp_path / "x").exists()


# -- both on the smoke testbed ---------------------------------------------------------------------------------


SMOKE = [("wagle", {}), ("wagle", {"objective": "npo"}), ("selective_pruning", {"frac": 0.2})]


@pytest.mark.parametrize("name,args", SMOKE, ids=["wagle-grad_diff", "wagle-npo", "selective_pruning"])
def test_lowers_the_forget_leak_on_the_smoke_testbed(smoke_testbed, leak_and_nll, tmp_path, name, args) -> None:
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.prompts import qa_text
    from lacuna_unlearn.methods.selective_pruning import run_selective_pruning
    from lacuna_unlearn.qa.unlearn_data import split_rows

    data = load_data(smoke_testbed)
    forget, retain = split_rows(data, "forget", "all"), split_rows(data, "retain", "all")
    model = smoke_testbed / "model"
    if name == "wagle":
        out = unlearn(
            model, forget, retain, make_method("wagle", **args), tmp_path / name,
            train=TrainConfig(learning_rate=1e-2, max_steps=6, per_device_train_batch_size=8),
        )  # fmt: skip
    else:
        texts = [[qa_text(r["question"], r["answer"]) for r in rows] for rows in (forget, retain)]
        out = run_selective_pruning(model, *texts, tmp_path / name, SPConfig(**args), cache_dir=tmp_path / "cache")
    (leak_before, nll_before), (leak_after, nll_after) = leak_and_nll(model, forget), leak_and_nll(out, forget)
    assert leak_before > 0.5 and leak_after < leak_before, (leak_before, leak_after)
    assert nll_after > nll_before + 0.1, (nll_before, nll_after)
