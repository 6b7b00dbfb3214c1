"""WAGLE (weight-attribution masks + GradDiff/NPO) and Selective Pruning (neuron forget/retain activation ratio).

Closed forms on hand-made tensors (attribution score, top-k with ties, SP scores with eps, exact zeroing), the
trainer contract on the tiny memorizing model (out-of-mask scalars bit-identical in the saved checkpoint, AND with
``restrict=``, LoRA refused), the Hydra app, and both methods on the smoke testbed (forget NLL up, leak down).
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
    apply_selective_pruning,
    mlp_neurons,
    sp_prune_masks,
    sp_scores,
)
from lacuna_unlearn.methods.wagle import WAGLE, attribution_scores, top_fraction_masks
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LACUNA_CACHE=str(cwd / "cache"))  # never touch ~/.cache from tests
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, check=False)


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=6,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config).eval()


# -- WAGLE: pure functions -------------------------------------------------------------------------------------


def test_attribution_score_closed_form() -> None:
    w = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    g_f = torch.tensor([[2.0, 1.0], [-1.0, 4.0]])
    g_r = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])
    # S = |(w - g_r / mu) * g_f| with mu = 0.5:
    # [[|(1 - 2) * 2|, |(-2 - 0) * 1|], [|(0.5 + 1) * -1|, |(0 - 2) * 4|]] = [[2, 2], [1.5, 8]]
    assert attribution_scores(w, g_f, g_r, 0.5).tolist() == [[2.0, 2.0], [1.5, 8.0]]
    # mu -> infinity: the SNIP score |w * g_f|; a tiny mu: |g_r * g_f| / mu dominates
    assert torch.allclose(attribution_scores(w, g_f, g_r, 1e12), (w * g_f).abs())
    assert torch.allclose(attribution_scores(w, g_f, g_r, 1e-6) * 1e-6, (g_r * g_f).abs(), atol=1e-5)
    with pytest.raises(ValueError, match="mu"):
        attribution_scores(w, g_f, g_r, 0.0)
    with pytest.raises(ValueError, match="grad_retain"):
        attribution_scores(w, g_f, g_r[:1], 1.0)
    with pytest.raises(ValueError, match="not finite"):
        attribution_scores(w, g_f * float("nan"), g_r, 1.0)


def test_top_fraction_ties_by_hand() -> None:
    scores = {"a": torch.tensor([3.0, 1.0, 3.0]), "b": torch.tensor([[3.0, 0.0]])}
    # global, N = 5: k = int(0.4 * 5) = 2 of the three tied 3s -> the first two in (tensor order, index) order
    got = top_fraction_masks(scores, 0.4)
    assert got["a"].tolist() == [True, False, True] and got["b"].tolist() == [[False, False]]
    got = top_fraction_masks(scores, 0.6)  # k = 3: all three 3s
    assert got["a"].tolist() == [True, False, True] and got["b"].tolist() == [[True, False]]
    got = top_fraction_masks(scores, 0.5, "per_tensor")  # a: int(1.5) = 1, b: int(1.0) = 1
    assert got["a"].tolist() == [True, False, False] and got["b"].tolist() == [[True, False]]
    assert not any(m.any() for m in top_fraction_masks(scores, 0.0).values())
    assert all(m.all() for m in top_fraction_masks(scores, 1.0).values())
    with pytest.raises(ValueError, match="scope"):
        top_fraction_masks(scores, 0.5, "per_row")
    with pytest.raises(ValueError, match="not finite"):
        top_fraction_masks({"a": torch.tensor([float("nan")])}, 0.5)


def _brute_top(scores: dict[str, torch.Tensor], fraction: float, scope: str) -> dict[str, torch.Tensor]:
    """Sort (-score, tensor position, flat index) by hand and take the first k."""
    groups = [list(scores)] if scope == "global" else [[n] for n in scores]
    out = {n: torch.zeros(s.numel(), dtype=torch.bool) for n, s in scores.items()}
    for group in groups:
        entries = [(-float(v), t, i, n) for t, n in enumerate(group) for i, v in enumerate(scores[n].reshape(-1))]
        k = int(fraction * len(entries))
        for _, _, i, n in sorted(entries)[:k]:
            out[n][i] = True
    return {n: m.reshape(scores[n].shape) for n, m in out.items()}


@pytest.mark.parametrize("scope", ["global", "per_tensor"])
@pytest.mark.parametrize("fraction", [0.1, 0.35, 0.8])
def test_top_fraction_matches_brute_force_with_ties(scope: str, fraction: float) -> None:
    g = torch.Generator().manual_seed(3)
    scores = {n: torch.randint(0, 4, shape, generator=g).float() for n, shape in [("x", (3, 5)), ("y", (7,))]}
    got = top_fraction_masks(scores, fraction, scope)
    expected = _brute_top(scores, fraction, scope)
    for n in scores:
        assert torch.equal(got[n], expected[n]), n


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"ratio": 0.0}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"mu": 0.0}, "mu"),
        ({"objective": "simnpo"}, "objective"),
        ({"target": "embeddings"}, "target"),
        ({"scope": "per_row"}, "scope"),
        ({"batch_size": 0}, "batch_size"),
        ({"retain_loss_type": "mse"}, "retain_loss_type"),
    ],
)
def test_wagle_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_method("wagle", **kwargs)


def test_wagle_objective_delegates() -> None:
    assert not make_method("wagle").needs_reference
    assert make_method("wagle", objective="npo").needs_reference
    assert make_method("wagle", retain_loss_type="kl").needs_reference
    from dataclasses import asdict

    assert asdict(make_method("wagle", objective="npo", beta=0.3))["beta"] == 0.3  # the manifest's method_args


# -- Selective Pruning: pure functions -------------------------------------------------------------------------


def test_sp_scores_by_hand_with_eps() -> None:
    xf = torch.tensor([1.0, 2.0, 0.0, 3.0])
    xr = torch.tensor([1.0, 0.0, 0.0, 3.0])
    assert sp_scores(xf, xr, eps=0.5).tolist() == [1 / 1.5, 4.0, 0.0, 3 / 3.5]
    # eps decides between "quiet on retain" and "loud on forget": eps 1e-5 favours neuron 0, eps 1 neuron 1
    xf, xr = torch.tensor([0.01, 10.0]), torch.tensor([0.0, 1.0])
    pick = {"d": xf}, {"d": xr}
    assert sp_prune_masks(*pick, SPConfig(frac=0.5, eps=1e-5))["d"].tolist() == [True, False]
    assert sp_prune_masks(*pick, SPConfig(frac=0.5, eps=1.0))["d"].tolist() == [False, True]
    with pytest.raises(ValueError, match="x_retain"):
        sp_scores(xf, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="eps"):
        sp_scores(xf, xr, eps=0.0)


def test_sp_pruned_set_global_per_layer_and_ties() -> None:
    xf = {"l0": torch.tensor([4.0, 1.0, 2.0, 2.0]), "l1": torch.tensor([2.0, 8.0, 1.0, 0.5])}
    xr = {"l0": torch.ones(4), "l1": torch.tensor([1.0, 2.0, 1.0, 1.0])}
    # eps -> 0: s = l0 [4, 1, 2, 2], l1 [2, 4, 1, 0.5]; global k = int(0.5 * 8) = 4:
    # the two 4s, then two of the three tied 2s -> l0[2], l0[3] (earlier layer first), not l1[0]
    got = sp_prune_masks(xf, xr, SPConfig(frac=0.5, eps=1e-12))
    assert got["l0"].tolist() == [True, False, True, True] and got["l1"].tolist() == [False, True, False, False]
    got = sp_prune_masks(xf, xr, SPConfig(frac=0.5, eps=1e-12, scope="per_layer"))  # 2 per layer
    assert got["l0"].tolist() == [True, False, True, False] and got["l1"].tolist() == [True, True, False, False]
    assert not any(m.any() for m in sp_prune_masks(xf, xr, SPConfig(frac=0.1)).values())  # int(0.8) = 0
    with pytest.raises(ValueError, match="x_retain"):
        sp_prune_masks(xf, {"l0": xr["l0"]}, SPConfig())


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"frac": 1.0}, "frac"),
        ({"frac": -0.1}, "frac"),
        ({"eps": 0.0}, "eps"),
        ({"scope": "per_row"}, "scope"),
        ({"mode": "rows"}, "mode"),
        ({"calib_samples": 0}, "calib_samples"),
        ({"max_length": 1.5}, "max_length"),
        ({"seed": "a"}, "seed"),
    ],
)
def test_sp_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SPConfig.{field}"):
        SPConfig(**kwargs).validate()


@pytest.mark.parametrize("mode", ["neuron", "down"])
def test_apply_zeroes_exactly_the_chosen_neurons(mode: str) -> None:
    model = _tiny_llama()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    downs = list(mlp_neurons(model))
    assert downs == [f"model.layers.{i}.mlp.down_proj.weight" for i in range(2)]
    xf = {
        downs[0]: torch.tensor([1.0, 5.0, 1.0, 1.0, 1.0, 1.0]),
        downs[1]: torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 9.0]),
    }
    xr = {n: torch.ones(6) for n in downs}
    xf["model.layers.0.self_attn.q_proj.weight"] = torch.ones(8)  # extra statistics are ignored
    stats = apply_selective_pruning(model, xf, xr, SPConfig(frac=2 / 12 + 1e-9, mode=mode))  # k = 2 of 12
    assert stats["neurons"] == {downs[0]: [1], downs[1]: [5]} and stats["pruned_total"] == 2
    assert stats["neurons_total"] == 12
    changed = set()
    for name, value in model.state_dict().items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        j = {0: 1, 1: 5}.get(layer)
        expected = before[name].clone()
        if name.endswith("mlp.down_proj.weight"):
            expected[:, j] = 0
        elif mode == "neuron" and (name.endswith("mlp.gate_proj.weight") or name.endswith("mlp.up_proj.weight")):
            expected[j, :] = 0
        assert torch.equal(value, expected), name
        if not torch.equal(value, before[name]):
            changed.add(name)
    assert changed == set(stats["zeroed"])
    assert len(changed) == (6 if mode == "neuron" else 2)


# -- WAGLE on the tiny memorizing model ------------------------------------------------------------------------

WAGLE_ARGS = {"ratio": 0.2, "mu": 1e-3, "batch_size": 2}


def _datasets(model_dir, rows):
    from transformers import AutoTokenizer

    from lacuna_unlearn.trainer.unlearn_data import QADataset, collate_forget_retain

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
    from lacuna_unlearn.trainer.lora import LoraSettings

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
    from lacuna_unlearn.trainer.unlearn_data import split_rows

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
