"""Masked continual pretraining: exact gradient masking through the real HF Trainer, step plans."""

from __future__ import annotations

import random

import pytest
import torch

from lacuna_metrics.masks import MaskError, build_masks, named_shapes_of
from lacuna_unlearn.testbed.injection import NEUTRAL, StepBatches, StepPlan, mask_gradients, train_steps


def tiny_olmo(seed: int = 0):
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    config = Olmo2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    return Olmo2ForCausalLM(config)


def random_docs(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 97) for _ in range(rng.randrange(8, 20))] for _ in range(n)]


def steps_dataset(plan: StepPlan, replicas: int = 1) -> StepBatches:
    return StepBatches(
        plan,
        pii_qa={g: random_docs(6, g) for g in range(6)},
        pii_bio={g: random_docs(3, 100 + g) for g in range(6)},
        neutral_rows=[[(i * 7 + j) % 95 + 2 for j in range(16)] for i in range(20)],
        pii_batch=3,
        neutral_batch=2,
        faq_fraction=0.5,
        seq_len=16,
        pad_id=0,
        replicas=replicas,
        seed=3,
    )


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
