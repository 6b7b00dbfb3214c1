"""Restricted unlearning (OracleGrad): out-of-mask scalars stay bit-identical under AdamW (through the HF Trainer:
tests/e2e/test_restrict_hf_trainer.py; shared model and masks: tests/helpers/restrict.py).
"""

from __future__ import annotations

import re

import pytest
import torch
from helpers.restrict import DOWN0, LAYERS, VOCAB, assert_restricted, lm_batch, snapshot, tiny_llama, tiny_masks

from lacuna_metrics.masks import MaskSet, load_masks, named_shapes_of
from lacuna_unlearn.trainer.restrict import (
    Restriction,
    RestrictionError,
    apply_restriction,
    check_optimizer,
    param_groups,
    parse_restriction,
    restriction_stats,
    verify_unchanged,
)

Q1 = "model.layers.1.self_attn.q_proj.weight"


def train(model, optimizer, steps: int = 4) -> None:
    model.train()
    for step in range(steps):
        optimizer.zero_grad()
        model(**lm_batch(step)).loss.backward()
        optimizer.step()


# --------------------------------------------------------------------------------------------------
# Spec parsing


def test_parse_restriction_specs():
    assert parse_restriction("forget_mask") == Restriction("forget_mask")
    assert parse_restriction(" none ") == Restriction("none")
    assert parse_restriction("groups:0,2") == Restriction("groups", groups=(0, 2))
    assert parse_restriction("groups: 4, 2,4") == Restriction("groups", groups=(4, 2))
    assert parse_restriction(r"regex:mlp\.(up|down)_proj") == Restriction("regex", pattern=r"mlp\.(up|down)_proj")
    for spec in ("forget_mask", "none", "groups:0,2", r"regex:layers\.0\."):
        assert str(parse_restriction(spec)) == spec
    assert parse_restriction("groups:1").needs_masks and not parse_restriction("regex:x").needs_masks


@pytest.mark.parametrize(
    ("spec", "detail"),
    [
        ("", "expected 'forget_mask'"),
        ("forget", "expected 'forget_mask'"),
        ("retain_mask", "expected 'forget_mask'"),
        ("groups:", "group '' is not an integer"),
        ("groups:0,,2", "group '' is not an integer"),
        ("groups:a", "group 'a' is not an integer"),
        ("groups:-1", "group '-1' is not an integer"),
        ("groups:32", "group '32' is not an integer"),
        ("regex:", "empty regex"),
        ("regex:(", "invalid regex"),
    ],
)
def test_bad_specs_name_the_string(spec, detail):
    with pytest.raises(ValueError, match=re.escape(repr(spec))) as info:
        parse_restriction(spec)
    assert detail in str(info.value)


def test_non_string_spec():
    with pytest.raises(ValueError, match="must be a string"):
        parse_restriction(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Resolution


def test_resolve_forget_mask_matches_maskset():
    model = tiny_llama()
    masks = tiny_masks(model)
    resolved = parse_restriction("forget_mask").resolve(model, masks)
    assert set(resolved) == set(masks.packed)  # embeddings, norms, lm_head are not in the masks
    for name, mask in resolved.items():
        assert mask is not None and mask.dtype == torch.bool
        assert torch.equal(mask, masks.forget_mask(name))
    assert all(p.requires_grad for p in model.parameters())  # resolve changes nothing
    stats = restriction_stats(model, resolved)
    assert stats["num_masked_parameters"] == len(masks.packed)
    assert stats["trainable_scalars"] == sum(int(masks.forget_mask(n).sum()) for n in masks.packed)
    assert 0 < stats["trainable_fraction"] < 0.5


def test_full_and_empty_masks_become_whole_or_frozen():
    model = tiny_llama()
    shapes = named_shapes_of(model)
    masks = MaskSet(
        packed={
            DOWN0: torch.full(shapes[DOWN0], 0b101, dtype=torch.int32),  # every scalar in forget groups 0 and 2
            Q1: torch.full(shapes[Q1], 0b10, dtype=torch.int32),  # retain group 1 only
            "model.embed_tokens.weight": torch.zeros(shapes["model.embed_tokens.weight"], dtype=torch.int32),
        }
    )
    assert parse_restriction("forget_mask").resolve(model, masks) == {DOWN0: None}
    assert parse_restriction("groups:1").resolve(model, masks) == {Q1: None}
    assert set(parse_restriction("groups:0,1").resolve(model, masks)) == {DOWN0, Q1}


def test_already_frozen_parameters_are_not_candidates():
    model = tiny_llama()
    model.get_submodule("model.layers.0.mlp.down_proj").weight.requires_grad_(False)
    assert DOWN0 not in parse_restriction("forget_mask").resolve(model, tiny_masks(model))
    assert DOWN0 not in parse_restriction("none").resolve(model)


# --------------------------------------------------------------------------------------------------
# Training: plain AdamW loop


def test_forget_mask_adamw_keeps_out_of_mask_scalars_bit_identical():
    model = tiny_llama()
    masks = tiny_masks(model)
    resolved = parse_restriction("forget_mask").resolve(model, masks)
    handle = apply_restriction(model, resolved)
    assert sorted(handle.masked_names) == sorted(masks.packed)
    optimizer = torch.optim.AdamW(param_groups(model, resolved, weight_decay=0.1), lr=1e-2)
    check_optimizer(optimizer, model, resolved)
    before = snapshot(model)
    train(model, optimizer, steps=5)
    assert_restricted(model, before, resolved)
    # Adam state outside the mask is still exactly zero.
    for name, param in model.named_parameters():
        if name in resolved:
            state = optimizer.state[param]
            assert not state["exp_avg"][~resolved[name]].any() and not state["exp_avg_sq"][~resolved[name]].any()
        else:
            assert param not in optimizer.state
    handle.remove()


def test_plain_adamw_weight_decay_breaks_it_and_is_detected():
    """Negative control: the hooks alone are not enough if weight decay touches restricted parameters."""
    model = tiny_llama()
    resolved = parse_restriction("forget_mask").resolve(model, tiny_masks(model))
    apply_restriction(model, resolved)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)  # default wd 0.01
    with pytest.raises(ValueError, match=r"restricted parameter 'model\.layers\.0\..*weight_decay=0\.01"):
        check_optimizer(optimizer, model, resolved)
    before = snapshot(model)
    train(model, optimizer, steps=2)
    assert sorted(verify_unchanged(before, model, resolved)) == sorted(resolved)


def test_groups_restriction_leaves_other_forget_groups_alone():
    model = tiny_llama()
    masks = tiny_masks(model)
    resolved = parse_restriction("groups:0,2").resolve(model, masks)
    for name, mask in resolved.items():
        assert torch.equal(mask, masks.union(name, (0, 2)))
        assert not (mask & masks.group(name, 4)).any()
    apply_restriction(model, resolved)
    optimizer = torch.optim.AdamW(param_groups(model, resolved, weight_decay=0.1), lr=1e-2)
    before = snapshot(model)
    train(model, optimizer, steps=3)
    assert_restricted(model, before, resolved)
    for name in resolved:  # group 4 is a forget group, but not selected: untouched
        g4 = masks.group(name, 4)
        assert torch.equal(model.get_parameter(name).detach()[g4], before[name][g4])


def test_regex_restriction_trains_whole_matching_parameters_without_masks():
    model = tiny_llama()
    resolved = parse_restriction(r"regex:mlp\.down_proj").resolve(model, None)
    assert resolved == {f"model.layers.{i}.mlp.down_proj.weight": None for i in range(LAYERS)}
    handle = apply_restriction(model, resolved)
    assert handle.hooks == [] and len(handle.frozen) == len(list(model.parameters())) - LAYERS
    optimizer = torch.optim.AdamW(param_groups(model, resolved, weight_decay=0.1), lr=1e-2)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1]
    before = snapshot(model)
    train(model, optimizer, steps=2)
    assert_restricted(model, before, resolved, expect_masked=False)


def test_none_restriction_trains_everything():
    model = tiny_llama()
    resolved = parse_restriction("none").resolve(model, tiny_masks(model))
    assert resolved == {n: None for n, _ in model.named_parameters()}
    handle = apply_restriction(model, resolved)
    assert handle.hooks == [] and handle.frozen == []


def test_param_groups_split_and_decay_names():
    model = tiny_llama()
    shapes = named_shapes_of(model)
    masks = tiny_masks(model)
    masks.packed[DOWN0] = torch.ones(shapes[DOWN0], dtype=torch.int32)  # fully group 0 -> whole parameter
    masks.packed["model.norm.weight"] = torch.ones(shapes["model.norm.weight"], dtype=torch.int32)
    resolved = parse_restriction("forget_mask").resolve(model, masks)
    assert resolved[DOWN0] is None and resolved["model.norm.weight"] is None
    groups = param_groups(model, resolved, 0.01)
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(len(resolved) - 2, 0.0), (2, 0.01)]
    groups = param_groups(model, resolved, 0.01, decay_parameter_names={DOWN0})
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(len(resolved) - 2, 0.0), (1, 0.01), (1, 0.0)]
    assert groups[1]["params"][0] is model.get_parameter(DOWN0)


# --------------------------------------------------------------------------------------------------
# Released flat mask.pt


def test_flat_mask_pt_is_reshaped_and_matches_shaped_masks(tmp_path):
    model = tiny_llama()
    masks = tiny_masks(model)
    release = {n: torch.zeros(p.numel(), dtype=torch.int32) for n, p in model.named_parameters()}
    release.update({n: p.flatten().clone() for n, p in masks.packed.items()})  # zeros for skipped tensors
    torch.save(release, tmp_path / "mask.pt")
    flat = load_masks(tmp_path / "mask.pt")
    assert flat.packed[DOWN0].dim() == 1
    resolved = parse_restriction("forget_mask").resolve(model, flat)
    expected = parse_restriction("forget_mask").resolve(model, masks)
    assert resolved.keys() == expected.keys()
    assert all(torch.equal(resolved[n], expected[n]) for n in expected)
    apply_restriction(model, resolved)
    optimizer = torch.optim.AdamW(param_groups(model, resolved, 0.1), lr=1e-2)
    before = snapshot(model)
    train(model, optimizer, steps=2)
    assert_restricted(model, before, resolved)


# --------------------------------------------------------------------------------------------------
# Hooks


def test_remove_restores_unrestricted_training():
    model = tiny_llama()
    resolved = parse_restriction("forget_mask").resolve(model, tiny_masks(model))
    with apply_restriction(model, resolved) as handle:
        assert not model.get_parameter("model.embed_tokens.weight").requires_grad
        model(**lm_batch(0)).loss.backward()
        assert model.get_parameter("model.embed_tokens.weight").grad is None
        assert not model.get_parameter(Q1).grad[~resolved[Q1]].any()
    assert handle.removed and handle.hooks == []
    handle.remove()  # idempotent
    assert all(p.requires_grad for p in model.parameters())
    model.zero_grad()
    model(**lm_batch(0)).loss.backward()
    assert model.get_parameter(Q1).grad[~resolved[Q1]].abs().sum() > 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    before = snapshot(model)
    train(model, optimizer, steps=1)
    assert sorted(verify_unchanged(before, model, resolved)) == sorted(n for n, _ in model.named_parameters())


def test_hook_zeroes_nonfinite_out_of_mask_grads_and_accumulates():
    model = tiny_llama()
    resolved = parse_restriction("forget_mask").resolve(model, tiny_masks(model))
    apply_restriction(model, resolved)
    param, mask = model.get_parameter(Q1), resolved[Q1]
    weight = torch.where(mask, torch.tensor(2.0), torch.tensor(float("inf")))
    weight[tuple((~mask).nonzero()[0])] = float("nan")
    assert weight.isnan().sum() == 1
    for _ in range(2):  # two backward passes accumulate
        (param * weight).sum().backward()
    assert torch.equal(param.grad, torch.where(mask, torch.tensor(4.0), torch.tensor(0.0)))
    assert param.grad.dtype == param.dtype


def test_tied_alias_names_in_masks():
    model = tiny_llama(tie=True)
    assert "lm_head.weight" not in dict(model.named_parameters())
    shape = (VOCAB, 16)
    packed = torch.zeros(shape, dtype=torch.int32)
    packed[:4] = 1
    masks = MaskSet(packed={"lm_head.weight": packed})
    resolved = parse_restriction("forget_mask").resolve(model, masks)
    assert list(resolved) == ["model.embed_tokens.weight"] and torch.equal(
        resolved["model.embed_tokens.weight"], packed == 1
    )
    masks.packed["model.embed_tokens.weight"] = torch.zeros(shape, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"tied names of parameter 'model\.embed_tokens\.weight'"):
        parse_restriction("forget_mask").resolve(model, masks)


# --------------------------------------------------------------------------------------------------
# Errors


def test_resolve_errors_name_the_tensor():
    model = tiny_llama()
    shapes = named_shapes_of(model)
    forget = parse_restriction("forget_mask")

    with pytest.raises(ValueError, match=r"'forget_mask' needs a mask set.*masks=None"):
        forget.resolve(model, None)
    with pytest.raises(ValueError, match=r"'groups:0,2' needs a mask set"):
        parse_restriction("groups:0,2").resolve(model)

    missing = MaskSet(packed={"model.layers.7.mlp.up_proj.weight": torch.ones(32, 16, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"'model\.layers\.7\.mlp\.up_proj\.weight' names a parameter the model lacks"):
        forget.resolve(model, missing)

    transposed = MaskSet(packed={DOWN0: torch.ones(tuple(reversed(shapes[DOWN0])), dtype=torch.int32)})
    with pytest.raises(
        ValueError, match=rf"{re.escape(repr(DOWN0))} has shape \(32, 16\) but parameter has shape \(16, 32\)"
    ):
        forget.resolve(model, transposed)

    short = MaskSet(packed={DOWN0: torch.ones(100, dtype=torch.int32)})
    with pytest.raises(
        ValueError, match=rf"{re.escape(repr(DOWN0))} has 100 scalars but parameter has shape \(16, 32\)"
    ):
        forget.resolve(model, short)

    retain_only = MaskSet(packed={DOWN0: torch.full(shapes[DOWN0], 0b10, dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"'forget_mask' leaves nothing trainable.*groups \(0, 2, 4\)"):
        forget.resolve(model, retain_only)
    with pytest.raises(ValueError, match=r"'groups:7': groups \[7\] are not in the mask set's \[0, 6\)"):
        parse_restriction("groups:7").resolve(model, retain_only)
    with pytest.raises(ValueError, match=r"'regex:no_such_module' leaves nothing trainable"):
        parse_restriction("regex:no_such_module").resolve(model)

    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        parse_restriction("none").resolve(model)


def test_apply_and_verify_errors_name_the_tensor():
    model = tiny_llama()
    with pytest.raises(RestrictionError, match=r"'model\.nope\.weight' is not a parameter"):
        apply_restriction(model, {"model.nope.weight": None})
    with pytest.raises(RestrictionError, match=rf"{re.escape(repr(DOWN0))} has shape \(32, 16\)"):
        apply_restriction(model, {DOWN0: torch.ones(32, 16, dtype=torch.bool)})
    with pytest.raises(RestrictionError, match=rf"{re.escape(repr(DOWN0))} must be a bool tensor"):
        apply_restriction(model, {DOWN0: torch.ones(16, 32)})
    with pytest.raises(RestrictionError, match="nothing trainable"):
        apply_restriction(model, {})
    assert all(p.requires_grad for p in model.parameters())  # failed applies change nothing

    resolved = {DOWN0: None}
    before = snapshot(model)
    del before[Q1]
    with pytest.raises(RestrictionError, match=rf"no tensor for parameter {re.escape(repr(Q1))}"):
        verify_unchanged(before, model, resolved)
    before = snapshot(model)
    before[Q1] = before[Q1].double()
    with pytest.raises(RestrictionError, match=rf"before_state\[{re.escape(repr(Q1))}\] is torch.float64"):
        verify_unchanged(before, model, resolved)


def test_check_optimizer_flags_stale_moments_and_unfrozen_parameters():
    model = tiny_llama()
    resolved = parse_restriction("forget_mask").resolve(model, tiny_masks(model))
    warm = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    train(model, warm, steps=1)  # nonzero moments everywhere
    with pytest.raises(
        ValueError, match=r"'model\.embed_tokens\.weight' is outside the restriction but still requires grad"
    ):
        check_optimizer(warm, model, resolved)
    apply_restriction(model, resolved)
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of restricted parameter 'model\.layers\.0\."):
        check_optimizer(warm, model, resolved)


def test_verify_unchanged_is_bitwise():
    model = tiny_llama()
    resolved = {DOWN0: None}
    before = snapshot(model)
    with torch.no_grad():
        model.get_parameter(Q1)[0, 0] = float("nan")
    before[Q1][0, 0] = float("nan")
    assert verify_unchanged(before, model, resolved) == []  # NaN bits equal
    with torch.no_grad():
        model.get_parameter("model.norm.weight")[0] = -0.0
    before["model.norm.weight"][0] = 0.0
    assert verify_unchanged(before, model, resolved) == ["model.norm.weight"]


def test_intersect_ands_masks_and_drops_what_either_side_leaves_out() -> None:
    from lacuna_unlearn.trainer.restrict import intersect

    a = torch.tensor([True, True, False])
    b = torch.tensor([True, False, True])
    out = intersect({"w": a, "v": None, "u": None, "x": a}, {"w": b, "v": b, "u": None})
    assert set(out) == {"w", "v", "u"}  # x: not located
    assert out["w"].tolist() == [True, False, False] and out["v"].tolist() == b.tolist() and out["u"] is None
    assert set(intersect({"w": a, "z": torch.tensor([False, True, False])}, {"w": ~a, "z": None})) == {"z"}
    with pytest.raises(RestrictionError, match="nothing trainable"):
        intersect({"w": a}, {"w": ~a})
    with pytest.raises(RestrictionError, match="'w'"):
        intersect({"w": a}, {"w": torch.ones(2, dtype=torch.bool)})
