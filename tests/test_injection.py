"""Masked continual pretraining: exact gradient masking through the real HF Trainer, step plans."""

from __future__ import annotations

import random

import pytest
import torch

from lacuna_metrics.masks import MaskError, build_masks, named_shapes_of
from lacuna_unlearn.injection import NEUTRAL, StepBatches, StepPlan, mask_gradients, train_steps


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
