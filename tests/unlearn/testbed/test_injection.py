"""Masked continual pretraining: step plans, gradient masking by hand and per micro-batch, clear errors (training
through the real HF Trainer: tests/e2e/test_injection_trainer.py; the tiny OLMo: tests/helpers/injection.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers.injection import steps_dataset, tiny_olmo

from lacuna_metrics.masks import MaskError, build_masks, named_shapes_of
from lacuna_unlearn.testbed.injection import NEUTRAL, OUTSIDE, StepPlan, mask_gradients, train_steps


@pytest.fixture(scope="module")
def model_and_masks():
    model = tiny_olmo()
    masks = build_masks(named_shapes_of(model), 4, budget=0.04, seed=5)
    return model, masks


def test_mask_gradients_by_hand(model_and_masks):
    _, masks = model_and_masks
    name = next(iter(masks.packed))
    param = torch.nn.Parameter(torch.zeros(masks.packed[name].shape))
    other = torch.nn.Parameter(torch.zeros(3))
    param.grad = torch.ones_like(param)
    other.grad = torch.ones_like(other)
    mask_gradients([(name, param), ("model.norm.weight", other)], masks, 1)
    assert torch.equal(param.grad.bool(), masks.group(name, 1))
    assert other.grad is None
    param.grad = torch.ones_like(param)
    mask_gradients([(name, param)], masks, NEUTRAL)
    assert bool(param.grad.all())


def test_step_plan_interleaving_and_group_balance():
    plan = StepPlan.interleaved(pii_steps=60, num_groups=6, neutral_every=5, neutral_lr_scale=0.1, seed=0)
    pii = [g for g in plan.groups if g != NEUTRAL]
    assert len(pii) == 60 and plan.groups.count(NEUTRAL) == 12
    assert all(pii.count(g) == 10 for g in range(6))
    assert all(s == (0.1 if g == NEUTRAL else 1.0) for g, s in zip(plan.groups, plan.lr_scale, strict=True))
    assert plan.groups == StepPlan.interleaved(60, 6, 5, 0.1, seed=0).groups


def test_step_batches_are_group_homogeneous_across_replicas():
    plan = StepPlan([0, NEUTRAL, 5], [1.0] * 3)
    data = steps_dataset(plan, replicas=2)
    assert len(data) == 6
    for i in range(len(data)):
        item = data[i]
        assert int(item["group_id"]) == plan.groups[i // 2]
        assert item["input_ids"].shape == item["labels"].shape
        assert bool(((item["labels"] == -100) == (item["attention_mask"] == 0)).all())
    assert not torch.equal(data[0]["input_ids"], data[1]["input_ids"])  # replicas draw different documents


def test_mismatched_masks_fail_naming_the_tensor(tmp_path):
    big = tiny_olmo()
    masks = build_masks(named_shapes_of(big), 4, budget=0.04, seed=5)
    name = next(iter(masks.packed))
    masks.packed[name] = masks.packed[name][:, :-1].contiguous()
    plan = StepPlan([0], [1.0])
    with pytest.raises(MaskError, match=name.replace(".", r"\.")):
        train_steps(tiny_olmo(), steps_dataset(plan), plan, masks=masks, lr=1e-3, out_dir=tmp_path)


def test_model_without_eligible_names_is_a_clear_error():
    with pytest.raises(MaskError, match="eligible"):
        build_masks({"encoder.block.0.dense.weight": (4, 4), "shared.weight": (10, 4)}, num_layers=4)


def test_each_micro_batch_only_reaches_its_own_group_mask(model_and_masks, tmp_path):
    """Under gradient accumulation the increment each micro-batch adds to ``.grad`` is already masked by its own
    group (the hooks run before accumulation): a PII micro-batch of group g adds nothing outside mask g, a neutral
    one adds to every trainable weight."""
    from transformers import TrainingArguments

    from lacuna_unlearn.testbed.injection import MaskedTrainer, _unwrap

    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    model.get_input_embeddings().weight.requires_grad_(False)
    plan = StepPlan([0, 3, NEUTRAL, 5], [1.0] * 4, accum=4)
    data = steps_dataset(plan)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, report_to=[], use_cpu=True)
    trainer = MaskedTrainer(model=model, args=args, train_dataset=data, data_collator=_unwrap, masks=masks, plan=plan)
    trainer.current_gradient_accumulation_steps = plan.accum  # set by train(); here micro-batches run one by one
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    try:
        for i, group in enumerate(plan.groups):
            before = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in params}
            trainer.training_step(model, dict(data[i]))
            for name, param in params:
                added = param.grad - before[name]
                if group == NEUTRAL:
                    continue
                if name in masks.packed:
                    outside = ~masks.group(name, group)
                    assert not added[outside].any(), f"micro-batch of group {group} reached {name} outside its mask"
                else:
                    assert not added.any(), f"micro-batch of group {group} reached {name}, which is in no mask"
            if group == NEUTRAL:
                moved = [n for n, p in params if (p.grad - before[n]).any()]
                assert len(moved) == len(params), "a neutral micro-batch must reach every trainable weight"
    finally:
        trainer.masker.remove()


def test_separate_neutral_state_needs_one_micro_batch_per_step(model_and_masks, tmp_path):
    template, masks = model_and_masks
    plan = StepPlan([NEUTRAL, 2], [1.0, 1.0], accum=2)
    with pytest.raises(ValueError, match="grad_accum=1"):
        train_steps(tiny_olmo(), steps_dataset(plan), plan, masks=masks, lr=1e-2, out_dir=tmp_path,
                    separate_neutral_state=True)  # fmt: skip


def test_step_plan_with_accumulation():
    plan = StepPlan.interleaved(pii_steps=10, num_groups=6, neutral_every=4, neutral_lr_scale=0.5, seed=1, accum=4)
    assert len(plan.groups) % 4 == 0 and plan.steps == len(plan.groups) // 4
    assert sum(g != NEUTRAL for g in plan.groups) >= 10 and plan.groups.count(NEUTRAL) == 2
    assert all(plan.step_scale(s) in (0.5, 1.0) for s in range(plan.steps))
    assert StepPlan([NEUTRAL, NEUTRAL, 2, NEUTRAL], [0.5, 0.5, 1.0, 0.5], accum=2).step_scale(0) == 0.5
    assert StepPlan([NEUTRAL, NEUTRAL, 2, NEUTRAL], [0.5, 0.5, 1.0, 0.5], accum=2).step_scale(1) == 1.0
    with pytest.raises(ValueError, match="whole steps"):
        StepPlan([0, 1, 2], [1.0] * 3, accum=2)


def test_step_batches_map_items_to_micro_batches_across_processes():
    """Items s*P*A + k*P + p: process p's k-th micro-batch of step s (accelerate's round-robin sharding)."""
    plan = StepPlan([0, NEUTRAL, 5, 2], [1.0] * 4, accum=2)
    data = steps_dataset(plan, replicas=3)
    assert len(data) == 12
    for i in range(len(data)):
        step, j = divmod(i, 6)
        micro = step * 2 + j // 3
        assert data.micro_batch(i) == (micro, j % 3)
        assert int(data[i]["group_id"]) == plan.groups[micro]


def test_all_groups_plan_puts_every_group_and_neutral_text_in_every_step():
    """``step_mix: all_groups`` (LACUNA's step): each optimizer step accumulates one PII micro-batch of every group
    (seeded order) and the neutral micro-batches, so every trainable scalar gets gradient on every step."""
    plan = StepPlan.all_groups(pii_steps=20, num_groups=6, neutral_per_step=2, seed=0)
    assert plan.accum == 8 and plan.steps == 4  # 20 PII micro-batches rounded up to whole steps of 6
    for s in range(plan.steps):
        step = plan.groups[s * 8 : (s + 1) * 8]
        assert sorted(g for g in step if g != NEUTRAL) == list(range(6)) and step.count(NEUTRAL) == 2
        assert plan.step_scale(s) == 1.0
    assert plan.groups == StepPlan.all_groups(20, 6, 2, seed=0).groups
    assert plan.groups != StepPlan.all_groups(20, 6, 2, seed=1).groups
    assert StepPlan.all_groups(12, 6, 0, seed=0).groups.count(NEUTRAL) == 0


def test_injection_plan_follows_the_step_mix():
    from lacuna_unlearn.testbed.build import injection_plan
    from lacuna_unlearn.testbed.presets import get_preset

    cfg = get_preset("smoke", pii_steps=30, step_mix="all_groups", neutral_per_step=1, neutral_optimizer="shared",
                     outside_slot=False, outside_batch=None)  # fmt: skip
    plan = injection_plan(cfg)
    assert plan.accum == 7 and plan.steps == 5 and plan.groups.count(NEUTRAL) == 5
    old = injection_plan(cfg.replace(step_mix="interleaved", neutral_every=3))
    assert old.accum == 1 and old.groups.count(NEUTRAL) == 10
    slot = injection_plan(get_preset("smoke", pii_steps=30))  # the preset's own plan: one outside slot per cycle
    assert slot.groups.count(OUTSIDE) == 5 and NEUTRAL not in slot.groups


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_neutral_loss_scale_scales_only_neutral_gradients(model_and_masks, tmp_path, scale):
    """``neutral_loss_scale`` multiplies a neutral micro-batch's gradient (every weight) and leaves a PII
    micro-batch's alone."""
    from transformers import TrainingArguments

    from lacuna_unlearn.testbed.injection import MaskedTrainer, _unwrap

    template, masks = model_and_masks
    plan = StepPlan([NEUTRAL, 2], [1.0, 1.0])
    data = steps_dataset(plan)
    grads = {}
    for factor in (1.0, scale):
        model = tiny_olmo()
        model.load_state_dict(template.state_dict())
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, report_to=[], use_cpu=True)
        trainer = MaskedTrainer(model=model, args=args, train_dataset=data, data_collator=_unwrap, masks=masks,
                                plan=plan, neutral_loss_scale=factor)  # fmt: skip
        trainer.current_gradient_accumulation_steps = 1
        try:
            for i in range(2):
                model.zero_grad()
                trainer.training_step(model, dict(data[i]))
                grads[factor, i] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        finally:
            trainer.masker.remove()
    for name, g in grads[1.0, 0].items():
        assert torch.allclose(grads[scale, 0][name], scale * g, rtol=1e-3, atol=1e-7), name
    for name, g in grads[1.0, 1].items():
        assert torch.equal(grads[scale, 1][name], g), name


def test_outside_slot_plan_and_masking(model_and_masks, tmp_path):
    """``outside_slot``: each cycle of the groups holds one OUTSIDE micro-batch (neutral text, not counted as PII);
    its gradient reaches only the eligible scalars outside every mask: nothing inside a mask, nothing in a tensor
    without a mask (norms, the last layer, the head)."""
    from transformers import TrainingArguments

    from lacuna_unlearn.testbed.injection import MaskedTrainer, _unwrap

    plan = StepPlan.interleaved(pii_steps=60, num_groups=6, neutral_every=0, neutral_lr_scale=1.0, seed=0,
                                outside_slot=True)  # fmt: skip
    assert sum(g >= 0 for g in plan.groups) == 60 and plan.groups.count(OUTSIDE) == 10
    for cycle in range(10):
        assert sorted(plan.groups[cycle * 7 : (cycle + 1) * 7]) == [OUTSIDE, *range(6)]
    assert set(plan.lr_scale) == {1.0}
    with_neutral = StepPlan.interleaved(pii_steps=60, num_groups=6, neutral_every=4, neutral_lr_scale=0.05, seed=0,
                                        outside_slot=True)  # fmt: skip
    assert [g for g in with_neutral.groups if g != NEUTRAL] == plan.groups  # the same order, neutral ones added
    data = steps_dataset(with_neutral)
    rows = {g: data[i]["input_ids"].shape[0] for i, g in enumerate(with_neutral.groups)}
    assert rows[OUTSIDE] == rows[NEUTRAL] == 2 and rows[0] == 3  # neutral_batch rows, pii_batch documents
    data.outside_batch = 1  # outside_batch: rows of an outside micro-batch only
    rows = {g: data[i]["input_ids"].shape[0] for i, g in enumerate(with_neutral.groups)}
    assert (rows[OUTSIDE], rows[NEUTRAL]) == (1, 2)
    template, masks = model_and_masks
    model = tiny_olmo()
    model.load_state_dict(template.state_dict())
    model.get_input_embeddings().weight.requires_grad_(False)
    plan = StepPlan([OUTSIDE], [1.0])
    data = steps_dataset(plan)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=1, report_to=[], use_cpu=True)
    trainer = MaskedTrainer(model=model, args=args, train_dataset=data, data_collator=_unwrap, masks=masks, plan=plan)
    trainer.current_gradient_accumulation_steps = 1
    try:
        trainer.training_step(model, dict(data[0]))
    finally:
        trainer.masker.remove()
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if name in masks.packed:
            inside = masks.packed[name] != 0
            assert not param.grad[inside].any(), name
            assert param.grad[~inside].abs().sum() > 0, name
        else:
            assert not param.grad.any(), name
