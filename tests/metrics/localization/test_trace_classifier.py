"""The leak audit's trace classifier: chance on weights without a magnitude trace, finds a trace the single-feature
detectors miss (a band of middling displacements), reads a testbed on disk as it reads tensors in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.localization.trace_classifier import TRACE_CLASSIFIER, method_free_aucs, trace_classifier_aucs
from lacuna_metrics.masks import build_masks, save_masks

SHAPES = {
    **{f"model.layers.{i}.self_attn.q_proj.weight": (96, 64) for i in range(4)},
    **{f"model.layers.{i}.mlp.up_proj.weight": (128, 64) for i in range(4)},
}
FORGET_BITS, RETAIN_BITS = 0b010101, 0b101010


def _weights(kind: str, seed: int = 0):
    """(masks, base, before): ``none``: every scalar moved by the same law; ``band``: masked scalars moved by
    exactly the median displacement of the others (their |inj| is neither larger nor smaller on average)."""
    masks = build_masks(SHAPES, 4, budget=0.1, seed=3, skip_last=1)
    gen = torch.Generator().manual_seed(seed)
    base, before = {}, {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        base[name] = torch.randn(shape, generator=gen) * 0.02 * (1 + i % 3)  # tensors of different scales
        step = torch.randn(shape, generator=gen) * 1e-3
        if kind == "band" and name in masks.packed:
            masked = masks.packed[name] != 0
            step = torch.where(masked, torch.sign(step) * 0.6745e-3, step)  # median of |N(0, 1e-3)|
        before[name] = base[name] + step
    return masks, base, before


def _in_memory(masks, base, before):
    return method_free_aucs(
        ((n, before[n], base[n], masks.packed[n]) for n in masks.packed), FORGET_BITS, RETAIN_BITS, seed=1
    )


def test_no_trace_scores_chance_on_every_target():
    aucs = _in_memory(*_weights("none"))
    for detector in ("before_magnitude", "injection_magnitude", TRACE_CLASSIFIER):
        for target in TARGETS:
            assert aucs[detector][target] == pytest.approx(0.5, abs=0.03), (detector, target)


def test_the_classifier_finds_a_band_the_magnitudes_miss():
    """Masked scalars displaced by exactly the others' median |inj|: ranking by |inj| sees nothing (AUC 0.5), a
    classifier on the within-tensor quantile does (the band in the middle)."""
    aucs = _in_memory(*_weights("band"))
    assert aucs["injection_magnitude"]["unified"] == pytest.approx(0.5, abs=0.03)
    assert aucs[TRACE_CLASSIFIER]["unified"] > 0.8
    assert aucs[TRACE_CLASSIFIER]["forget_vs_retain"] == pytest.approx(0.5, abs=0.05)  # forget and retain alike


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    return path


def test_on_disk_matches_in_memory_and_needs_no_base(tmp_path):
    masks, base, before = _weights("band")
    save_masks(masks, tmp_path / "masks.safetensors")
    model, ref = _write(tmp_path / "model", before), _write(tmp_path / "base", base)
    on_disk = trace_classifier_aucs(model, tmp_path / "masks.safetensors", base=ref, seed=1)
    assert on_disk["auc"] == _in_memory(masks, base, before)[TRACE_CLASSIFIER]
    assert on_disk["features"] == ["before_magnitude_quantile", "injection_magnitude_quantile"]
    alone = trace_classifier_aucs(model, tmp_path / "masks.safetensors", seed=1)
    assert alone["features"] == ["before_magnitude_quantile"]
    assert alone["auc"]["unified"] == pytest.approx(0.5, abs=0.05)  # |θ_before| alone carries no band here
