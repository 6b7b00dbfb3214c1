"""The architecture matrix, end to end: on a tiny random model of every decoder-only family the issue names,
``lacuna-unlearn`` (the Hydra app's ``run``, in-process) restricted to the forget mask and with LoRA, and the
``lacuna_email`` task pack through lm-eval's evaluator. The anatomy, ``lacuna score`` and editing checks of the same
models are in tests/metrics/weights/test_architectures.py (shared inputs: tests/helpers/architectures.py). See
docs/anatomy.md.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.architectures import (
    ARCHITECTURES,
    Arch,
    World,
    _unlearn,
    make_arch,
    make_world,
)
from safetensors.torch import load_file

from lacuna_metrics.masks import load_masks
from lacuna_metrics.weights.anatomy import checkpoint_anatomy


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    """A small LACUNA dataset and a byte-level BPE tokenizer trained on it (seconds, no network)."""
    return make_world(tmp_path_factory.mktemp("architectures"))


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request, world) -> Arch:
    """One tiny random model of the architecture, saved with the tokenizer, and masks built for it."""
    return make_arch(request.param, world)


# -- lacuna-unlearn ------------------------------------------------------------------------------------------------


def test_unlearn_restricted_to_the_forget_mask(world, arch):
    out = _unlearn(
        world, arch, world.root / arch.name / "restricted", "method=grad_diff", "restrict=forget_mask",
        f"masks={arch.masks}",
    )  # fmt: skip
    masks = load_masks(arch.masks)
    before, after = load_file(str(arch.before / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before)
    moved = 0
    for name, b in before.items():
        a = after[name]
        if name in masks.packed:
            inside = masks.forget_mask(name).reshape(b.shape)
            assert torch.equal(a[~inside], b[~inside]), name  # out-of-mask scalars bit-identical
            moved += int((a[inside] != b[inside]).sum())
        else:
            assert torch.equal(a, b), name
    assert moved > 0


def test_task_pack_runs(world, arch):
    """``lacuna_email`` (its nine QA, paraphrase, ICR, worst-case and memorization tasks) through lm-eval's
    evaluator on the architecture (``lacuna_tasks.harness.evaluate``: ``simple_evaluate`` with the hf model and the tasks
    the CLI runs; the CLI itself runs per tokenizer family in tests/e2e/test_tokenizer_families_cli.py)."""
    import yaml

    from lacuna_tasks.harness.evaluate import evaluate
    from lacuna_tasks.harness.register import tasks_dir

    members = yaml.safe_load((tasks_dir() / "lacuna_email.yaml").read_text())["task"]
    results = evaluate(arch.before, ["lacuna_email"], data=world.data_dir, limit=2, batch_size=4)["results"]
    assert set(members) <= set(results), sorted(set(members) - set(results))
    for side in ("forget", "retain"):
        memorization = results[f"lacuna_email_{side}_memorization"]
        assert memorization["token_mismatch"] == 0.0
        assert all(0.0 <= memorization[m] <= 1.0 for m in ("em", "es", "prob")), memorization
    for task in ("lacuna_email_forget_qa", "lacuna_email_retain_qa"):
        assert any(isinstance(v, float) and not math.isnan(v) for v in results[task].values()), results[task]


def test_unlearn_with_lora(world, arch):
    out = _unlearn(world, arch, world.root / arch.name / "lora", "method=grad_ascent", "lora.enabled=true", "lora.r=2")
    before, after = load_file(str(arch.before / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before)  # merged: no adapter tensors left
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    disk = checkpoint_anatomy(
        {n: t.shape for n, t in before.items()}, json.loads((arch.before / "config.json").read_text()), arch.name
    )
    assert changed and all(n in disk.weights and disk.weights[n].kind == "weight" for n in changed), changed
    touched = {disk.weights[n].component for n in changed}
    assert "attention" in touched and (touched & {"mlp", "expert"}), touched
