"""Masked continual pretraining through the real HF Trainer (``train_steps``): exact gradient masking, neutral steps,
weight decay and momentum (step plans and hand-masked gradients: tests/unlearn/testbed/test_injection.py; the tiny
OLMo: tests/helpers/injection.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers.injection import steps_dataset, tiny_olmo

from lacuna_metrics.masks import build_masks, named_shapes_of
from lacuna_unlearn.testbed.injection import NEUTRAL, StepPlan, train_steps


@pytest.fixture(scope="module")
def model_and_masks():
    model = tiny_olmo()
    masks = build_masks(named_shapes_of(model), 4, budget=0.04, seed=5)
    return model, masks


@pytest.mark.parametrize("group", [0, 3])
def test_group_only_run_leaves_everything_outside_its_bit_bit_identical(model_and_masks, tmp_path, group):
    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = StepPlan([group] * 6, [1.0] * 6)
    train_steps(model, steps_dataset(plan), plan, masks=masks, lr=1e-2, out_dir=tmp_path, weight_decay=0.0, seed=1)
    changed_inside = 0
    for name, param in model.named_parameters():
        after = param.detach()
        if name in masks.packed:
            inside = masks.group(name, group)
            assert torch.equal(after[~inside], before[name][~inside]), f"{name} moved outside bit {group}"
            changed_inside += int((after[inside] != before[name][inside]).sum())
        else:
            assert torch.equal(after, before[name]), f"{name} is outside every mask but changed"
    assert changed_inside > 0.9 * masks.total_counts()[group]  # the group's own mask did learn


def test_unmasked_control_and_neutral_steps_update_everything_but_embeddings(model_and_masks, tmp_path):
    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = StepPlan([2, NEUTRAL, 4], [1.0, 0.5, 1.0])
    train_steps(model, steps_dataset(plan), plan, masks=None, lr=1e-2, out_dir=tmp_path, seed=1)
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            assert torch.equal(param.detach(), before[name]), "embeddings must stay frozen"
        else:
            assert not torch.equal(param.detach(), before[name]), f"{name} did not move"


def test_mixed_accumulated_steps_keep_other_weights_bit_identical(model_and_masks, tmp_path):
    """Steps mixing groups 1 and 4 (accumulation 2), no neutral text, no weight decay: only masks 1 and 4 move."""
    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = StepPlan([1, 4] * 4, [1.0] * 8, accum=2)
    train_steps(model, steps_dataset(plan), plan, masks=masks, lr=1e-2, out_dir=tmp_path, weight_decay=0.0, seed=1)
    for name, param in model.named_parameters():
        after = param.detach()
        if name in masks.packed:
            allowed = masks.group(name, 1) | masks.group(name, 4)
            assert torch.equal(after[~allowed], before[name][~allowed]), name
            assert (after[allowed] != before[name][allowed]).any(), name
        else:
            assert torch.equal(after, before[name]), name


def test_neutral_micro_batches_and_weight_decay_move_weights_outside_the_masks(model_and_masks, tmp_path):
    """LACUNA's regime: neutral text trains every weight and AdamW decays every weight, so after injection no
    eligible scalar outside the masks (nor the norms, last layer or head) is where it started."""
    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = StepPlan.interleaved(12, 6, neutral_every=3, neutral_lr_scale=1.0, seed=0, accum=2)
    assert NEUTRAL in plan.groups
    train_steps(model, steps_dataset(plan), plan, masks=masks, lr=1e-2, out_dir=tmp_path, weight_decay=0.1, seed=1)
    for name, param in model.named_parameters():
        if "embed_tokens" in name:
            continue
        changed = param.detach() != before[name]
        if name in masks.packed:
            outside = masks.packed[name] == 0
            assert changed[outside].float().mean() > 0.99, f"{name}: out-of-mask weights did not move"
        else:
            assert changed.float().mean() > 0.99, f"{name} did not move"


@pytest.mark.parametrize("separate", [False, True])
def test_neutral_momentum_moves_out_of_mask_weights_on_pii_steps_only_when_shared(model_and_masks, tmp_path, separate):
    """One neutral step, then PII steps of group 2, weight decay 0: with one shared AdamW state the neutral step's
    momentum keeps moving weights outside every mask during the PII steps; with ``separate_neutral_state`` (the
    prototype's two optimizers, docs/testbeds.md 'Neutral optimizer') they stay where the neutral step left them."""
    from transformers import TrainerCallback

    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    outside = [n for n, p in model.named_parameters() if p.requires_grad and "embed_tokens" not in n]
    outside = [n for n in outside if n not in masks.packed]  # norms, the last layer, the head
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            params = dict(model.named_parameters())
            snapshots[state.global_step] = {n: params[n].detach().clone() for n in outside}

    plan = StepPlan([NEUTRAL, 2, 2, 2], [1.0] * 4)
    train_steps(model, steps_dataset(plan), plan, masks=masks, lr=1e-2, out_dir=tmp_path, weight_decay=0.0, seed=1,
                callbacks=[Snapshot()], separate_neutral_state=separate)  # fmt: skip
    moved = [n for n in outside if not torch.equal(snapshots[1][n], snapshots[4][n])]
    if separate:
        assert moved == []
    else:
        assert len(moved) == len(outside)
