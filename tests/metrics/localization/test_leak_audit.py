"""Leak audit: null updates generated on read, every family and target scored, the gate fires on a leaky testbed.

Real safetensors checkpoints and masks in tmp dirs; the scorer is the one ``lacuna score`` uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.localization.leak_audit import (
    NULL_KINDS,
    LeakAuditError,
    NullUpdate,
    audit_testbed,
    leak_audit,
    stored_as,
)
from lacuna_metrics.localization.precision import BASELINES, SCORES
from lacuna_metrics.localization.trace_classifier import TRACE_CLASSIFIER
from lacuna_metrics.masks import build_masks, save_masks
from lacuna_metrics.weights.checkpoints import Checkpoint

SHAPES = {
    **{f"model.layers.{i}.self_attn.q_proj.weight": (48, 32) for i in range(4)},
    **{f"model.layers.{i}.mlp.up_proj.weight": (64, 32) for i in range(4)},
    "model.norm.weight": (32,),
}


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    return path


def _testbed(root: Path, *, leaky: bool) -> Path:
    """base/, model/ and masks.safetensors: injection only inside the masks (``leaky``: the pre-v2 regime, every
    scalar outside the masks unchanged) or, as LACUNA's regime, plus a drift of every weight."""
    masks = build_masks(SHAPES, 4, budget=0.05, seed=3, skip_last=1)
    gen = torch.Generator().manual_seed(0)
    base = {n: torch.randn(s, generator=gen) * 0.05 for n, s in SHAPES.items()}
    model = {}
    for name, tensor in base.items():
        inj = torch.zeros_like(tensor)
        if name in masks.packed:
            inj += (masks.packed[name] != 0).float() * torch.randn(tensor.shape, generator=gen) * 0.02
        if not leaky:
            inj += torch.randn(tensor.shape, generator=gen) * 0.02  # neutral steps and weight decay move everything
        model[name] = tensor + inj
    _write(root / "base", base)
    _write(root / "model", model)
    save_masks(masks, root / "masks.safetensors")
    return root


def test_null_update_is_reproducible_and_independent_of_blocks(tmp_path):
    before = Checkpoint(_write(tmp_path / "m", {"w": torch.randn(300, 500), "b": torch.randn(7)}))
    for kind, scale in (("gaussian", 1e-2), ("adam_sign", 1e-3)):
        null = NullUpdate(before, kind, seed=5, scale=scale)
        whole = null.read("w")
        pieces = torch.cat([null.read("w", lo, min(lo + 37, 300)) for lo in range(0, 300, 37)])
        assert torch.equal(whole, pieces)
        assert torch.equal(whole, NullUpdate(before, kind, seed=5, scale=scale).read("w"))
        assert not torch.equal(whole, NullUpdate(before, kind, seed=6, scale=scale).read("w"))
        update = whole - before.read("w")
        if kind == "adam_sign":
            assert torch.allclose(update.abs(), torch.full_like(update, scale), rtol=1e-3)
            assert 0.45 < float((update > 0).float().mean()) < 0.55
        else:
            rms = float(before.read("w").pow(2).mean().sqrt())
            assert float(update.std()) == pytest.approx(scale * rms, rel=0.02)
        assert null.read("b").shape == (7,)
    with pytest.raises(ValueError, match="unknown null update"):
        NullUpdate(before, "uniform", seed=0, scale=1.0)


def test_null_update_is_rounded_like_a_saved_checkpoint(tmp_path):
    """A method-free update saved in bf16 keeps only what bf16 holds: a null update stored like a bf16 checkpoint
    reads exactly as that update saved to disk; stored like a float32 one, it is not rounded."""
    w = torch.randn(300, 64, generator=torch.Generator().manual_seed(0)) * 0.05
    b16 = Checkpoint(_write(tmp_path / "b16", {"w": w.to(torch.bfloat16)}))
    f32 = Checkpoint(_write(tmp_path / "f32", {"w": w.to(torch.bfloat16).float()}))
    for kind, scale in (("gaussian", 1e-2), ("adam_sign", 1e-3)):
        null = NullUpdate(b16, kind, seed=5, scale=scale)  # stored like before: bf16
        exact = b16.read("w") + null.noise("w", 0, 300).reshape(300, 64)
        saved = Checkpoint(_write(tmp_path / f"saved_{kind}", {"w": exact.to(torch.bfloat16)}))
        assert torch.equal(null.read("w"), saved.read("w")) and not torch.equal(null.read("w"), exact)
        assert torch.equal(NullUpdate(b16, kind, seed=5, scale=scale, stored_like=f32).read("w"), exact)
        assert torch.equal(NullUpdate(f32, kind, seed=5, scale=scale).read("w"), exact)
    assert stored_as(b16) == ["bfloat16"] and stored_as(f32) == ["float32"]


def test_the_scorer_reads_the_null_update(tmp_path):
    """The scorer's walk reads a NullUpdate through ``read_stored`` (as every checkpoint): it sees the update,
    not ``before``'s own values."""
    from lacuna_metrics.localization.precision import Localization, LocalizationConfig
    from lacuna_metrics.masks import MaskReader

    root = _testbed(tmp_path / "tb", leaky=False)
    before = Checkpoint(root / "model")
    null = NullUpdate(before, "adam_sign", seed=0, scale=1e-3)
    moved: list[float] = []

    def seen(name: str, o: torch.Tensor, u: torch.Tensor) -> None:
        moved.append(float((u - o).abs().max()))

    config = LocalizationConfig(scores=("raw",), composite=False, threads=2)
    Localization(before, null, MaskReader(root / "masks.safetensors"), config=config).run(on_pair=seen)
    assert moved and min(moved) == pytest.approx(1e-3, rel=0.05)
    stored, values = null.read_stored("model.norm.weight")
    assert stored is values and torch.equal(values, null.read("model.norm.weight"))


def test_audit_scores_every_family_and_target(tmp_path):
    audit = audit_testbed(_testbed(tmp_path / "tb", leaky=False), seed=1, composite_samples=5000,
                          target="forget_vs_retain", max_auc=0.75)  # fmt: skip
    assert set(audit["trivial"]) == {*BASELINES, TRACE_CLASSIFIER}
    for detector in audit["trivial"].values():
        assert set(detector) == set(TARGETS)
    assert set(audit["null"]) == set(NULL_KINDS)
    applicable = {"raw", "qtile", "layernorm", "signrev", "reversal", "dirreversal", "composite"}
    for table in audit["null"].values():
        assert applicable <= set(table) <= {*SCORES, "composite"}
        for score in applicable:
            assert set(table[score]) == set(TARGETS) and all(v is not None for v in table[score].values())
    assert "contrast" in audit["not_applicable"]  # no unmasked control pair in a testbed
    assert audit["null_updates"]["gaussian"]["seed"] == 1 and audit["null_updates"]["adam_sign"]["lr"] == 1e-5
    assert audit["passed"] and audit["worst"]["auc"] <= 0.75 and audit["worst"]["target"] == "forget_vs_retain"
    # forget vs retain masks: both were injected alike, so no method-free detector separates them
    assert audit["trivial"]["injection_magnitude"]["forget_vs_retain"] == pytest.approx(0.5, abs=0.08)
    assert audit["trivial"][TRACE_CLASSIFIER]["forget_vs_retain"] == pytest.approx(0.5, abs=0.08)


def test_default_gate_checks_every_target_at_0_60(tmp_path):
    """The default gate reads every target: this testbed's masked scalars moved more than the others (injection
    plus drift vs drift alone), invisible on forget-vs-retain but not on unified, so the default audit fails where
    a forget-vs-retain gate passed, and names the detector and target."""
    root = _testbed(tmp_path / "tb", leaky=False)
    audit = audit_testbed(root, composite_samples=0)
    assert (audit["target"], audit["max_auc"]) == ("all", 0.60) and not audit["passed"]
    assert audit["worst"]["target"] in ("unified", "forget") and audit["trivial"][TRACE_CLASSIFIER]["unified"] > 0.55
    with pytest.raises(LeakAuditError, match=r"above 0\.6 AUC on every target: .* on (unified|forget)"):
        audit_testbed(root, composite_samples=0, raise_on_leak=True)
    assert audit_testbed(root, composite_samples=0, target="forget_vs_retain")["passed"]


def test_testbed_without_a_magnitude_trace_passes_every_target(tmp_path):
    """Masked and unmasked scalars displaced by one law (LACUNA's aim: no classifier on the weights finds the
    masks): every method-free detector, null updates included, stays under 0.60 on every target."""
    masks = build_masks(SHAPES, 4, budget=0.05, seed=3, skip_last=1)
    gen = torch.Generator().manual_seed(0)
    base = {n: torch.randn(s, generator=gen) * 0.05 for n, s in SHAPES.items()}
    _write(tmp_path / "base", base)
    _write(tmp_path / "model", {n: t + torch.randn(t.shape, generator=gen) * 0.02 for n, t in base.items()})
    save_masks(masks, tmp_path / "masks.safetensors")
    audit = audit_testbed(tmp_path, composite_samples=5000)
    assert audit["passed"], audit["worst"]
    assert audit["null_target"] == "all" and audit["null_max_auc"] == 0.60


def test_leaky_testbed_fails_the_gate(tmp_path):
    """Pre-v2 regime: inj = 0 outside the masks, so a null update's ``reversal`` reads the ground truth (unified)."""
    root = _testbed(tmp_path / "tb", leaky=True)
    audit = leak_audit(root / "model", root / "masks.safetensors", base=root / "base", target="unified",
                       composite_samples=5000)  # fmt: skip
    assert not audit["passed"]
    assert audit["null"]["adam_sign"]["reversal"]["unified"] > 0.99
    assert audit["trivial"]["injection_magnitude"]["unified"] > 0.99
    with pytest.raises(LeakAuditError, match=r"above 0\.9 AUC on unified: .*reversal"):
        audit_testbed(root, target="unified", max_auc=0.9, raise_on_leak=True, composite_samples=5000)
    with pytest.raises(ValueError, match="leak audit trivial target"):
        audit_testbed(root, target="everything")
