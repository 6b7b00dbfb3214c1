"""MemFlex (docs/definitions.md#memflex) on the tiny memorizing model: the located-only training on a real peft model
(non-located adapters bit-identical), the public ``unlearn`` path and the Hydra app, and clear errors when LoRA is
missing or the thresholds locate nothing (the localisation rule: tests/unlearn/methods/test_methods_memflex.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lacuna_unlearn.lora import LoraSettings
from lacuna_unlearn.methods import make_method
from lacuna_unlearn.methods.memflex import MemFlex
from lacuna_unlearn.qa.unlearn_data import ForgetRetainDataset, QADataset, collate_forget_retain
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn

LORA = LoraSettings(r=4, lora_alpha=16)
SEED = 42


# --------------------------------------------------------------------------- on the tiny model


def _peft_model(model_dir: Path):  # noqa: ANN202
    """The peft model exactly as ``unlearn`` builds it (same seed before loading, so the same lora_A init)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    return LORA.wrap(AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True))


def _split_threshold(stats: dict[str, dict[str, float]]) -> tuple[float, set[str]]:
    """A grad threshold in the widest gap of the middle half of the lora_B magnitudes, and the names above it."""
    grads = sorted((s["grad"], n) for n, s in stats.items() if "lora_B" in n)
    lo, hi = len(grads) // 4, 3 * len(grads) // 4
    i = max(range(lo, hi), key=lambda k: grads[k + 1][0] - grads[k][0])
    threshold = (grads[i][0] + grads[i + 1][0]) / 2
    return threshold, {n for g, n in grads if g > threshold}


@pytest.fixture(scope="module")
def data(tiny_lacuna, tiny_email_rows):  # noqa: ANN001, ANN201
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    forget_rows, retain_rows = tiny_email_rows
    forget, retain = QADataset(forget_rows, tok, name="forget"), QADataset(retain_rows, tok, name="retain")
    return forget, retain, collate_forget_retain(tok.pad_token_id)


@pytest.fixture(scope="module")
def split(tiny_lacuna, data):  # noqa: ANN001, ANN201
    """(threshold, names located with it) on the unlearn-identical peft model: every lora_B passes cos < 1.5."""
    forget, retain, collate = data
    method = MemFlex(cos_threshold=1.5, grad_threshold=0.0)
    method.locate(_peft_model(tiny_lacuna.model_dir), forget, retain, collate)
    assert all(s["grad"] == 0.0 for n, s in method.stats.items() if "lora_A" in n)  # lora_B = 0 at init
    assert all(s["grad"] > 0.0 for n, s in method.stats.items() if "lora_B" in n)
    return _split_threshold(method.stats)


def test_only_located_lora_parameters_train(tiny_lacuna, data, split) -> None:
    """locate + the trainer's own restriction helpers in a plain loop, observed on the peft model itself."""
    from lacuna_unlearn.trainer.restrict import apply_restriction, param_groups

    forget, retain, collate = data
    threshold, expected = split
    model = _peft_model(tiny_lacuna.model_dir)
    model.train()
    method = MemFlex(cos_threshold=1.5, grad_threshold=threshold)
    chosen = method.locate(model, forget, retain, collate)
    assert set(chosen) == expected and all(m is None for m in chosen.values())
    assert model.training and all(p.grad is None for p in model.parameters())  # locate left no trace
    lora_names = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert 0 < len(chosen) < len(lora_names) / 2  # a strict subset of the lora_B half

    def forget_nll() -> float:
        batch = collate([{"forget": forget[i]} for i in range(len(forget))])["forget"]
        model.eval()
        with torch.no_grad():
            return float(method.loss(model, {"forget": batch, "retain": batch}, None)[1]["forget_nll"])

    nll_before = forget_nll()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    handle = apply_restriction(model, chosen)
    optimizer = torch.optim.AdamW(param_groups(model, chosen, 0.0), lr=2e-2)
    loader = torch.utils.data.DataLoader(ForgetRetainDataset(forget, retain), batch_size=4, collate_fn=collate)
    model.train()
    for _ in range(3):
        for batch in loader:
            loss, logs = method.loss(model, batch, None)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    handle.remove()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == set(chosen)  # every located tensor moved, nothing else (base weights, lora_A, other lora_B)
    assert set(logs) == {"forget_nll", "retain_nll"}
    assert forget_nll() > nll_before + 0.5


def test_unlearn_trains_located_adapters_merges_and_raises_forget_nll(
    tiny_lacuna, tiny_email_rows, forget_nll, split, tmp_path
) -> None:
    """The public path: merged weights change exactly in the modules whose lora_B was located (a module whose
    lora_B stayed 0 merges to a bit-identical weight); the trainer itself checks that nothing else moved."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    forget, retain = tiny_email_rows
    threshold, expected = split
    out = unlearn(
        tiny_lacuna.model_dir, forget, retain, make_method("memflex", cos_threshold=1.5, grad_threshold=threshold),
        tmp_path / "memflex", train=TrainConfig(learning_rate=2e-2, max_steps=6, per_device_train_batch_size=4, seed=SEED),
        lora=LORA,
    )  # fmt: skip
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)  # a plain HF checkpoint
    assert not (out / "adapter_config.json").exists()
    before, after = load_file(tiny_lacuna.model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(after) == sorted(before)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    modules = {n.replace("base_model.model.", "").replace(".lora_B.default", ".base_layer") for n in expected}
    assert changed == {n.replace(".base_layer", "") for n in modules}
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["located"] == {"parameters": len(expected)} and manifest["out_of_mask_unchanged"] is True
    assert manifest["restriction"]["num_trainable_parameters"] == len(expected)
    assert manifest["method_args"]["grad_threshold"] == threshold and manifest["lora"]["lora_alpha"] == 16
    assert forget_nll(out, forget) > forget_nll(tiny_lacuna.model_dir, forget) + 0.5


# --------------------------------------------------------------------------- errors


def test_missing_lora_and_nothing_located_are_clear_errors(tiny_lacuna, tiny_email_rows, tmp_path) -> None:
    forget, retain = tiny_email_rows
    with pytest.raises(ValueError, match=r"has none: enable LoRA \(lora.enabled=true"):
        unlearn(tiny_lacuna.model_dir, forget, retain, make_method("memflex"), tmp_path / "no_lora")
    for args, pattern in [
        ({"grad_threshold": 1e9}, r"cos_threshold=0.92 and mean\|g_forget\| > grad_threshold=1000000000.0"),
        ({"cos_threshold": -1.0, "grad_threshold": 0.0}, r"cos_threshold=-1.0 .* grad_threshold=0.0"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            unlearn(tiny_lacuna.model_dir, forget, retain, make_method("memflex", **args), tmp_path / "none", lora=LORA)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no .partial


# --------------------------------------------------------------------------- Hydra


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def test_hydra_memflex_run_records_the_located_count(tiny_lacuna, tmp_path) -> None:
    common = [f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email", "method=memflex"]
    out = tmp_path / "memflex"
    proc = _app(
        *common, "lora.enabled=true", "method.args.grad_threshold=1e-5", "method.args.cos_threshold=1.5",
        "trainer.args.max_steps=2", "trainer.args.learning_rate=1e-2", f"output_dir={out}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    n = manifest["located"]["parameters"]
    assert f"[memflex] located {n} / " in proc.stderr and n > 0
    assert manifest["method"] == "memflex" and manifest["method_args"]["grad_threshold"] == 1e-5
    assert manifest["lora"] is not None and manifest["steps"] == 2 and (out / "model.safetensors").is_file()
