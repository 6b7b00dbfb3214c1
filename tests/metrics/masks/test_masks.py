"""Tests for lacuna_metrics.masks: LACUNA mask construction, bit semantics, file formats
(docs/definitions.md#lacuna-masks)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from lacuna_metrics.masks import (
    DEFAULT_ELIGIBLE_PATTERN,
    LACUNA_RELEASE_PATTERN,
    MaskError,
    MaskReader,
    MaskSet,
    build_masks,
    component,
    eligible_parameters,
    layer_index,
    load_masks,
    named_shapes_of,
    save_masks,
    stamp_masks,
    trivial_mask_stats,
)

NUM_LAYERS = 4


@pytest.fixture(scope="module")
def llama_shapes() -> dict[str, tuple[int, ...]]:
    """named_parameters shapes of a tiny Llama built from a config (no hub access)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=NUM_LAYERS,
        intermediate_size=64,
        vocab_size=100,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return named_shapes_of(transformers.LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def llama_masks(llama_shapes) -> MaskSet:
    return build_masks(llama_shapes, NUM_LAYERS)


def _popcount(t: torch.Tensor) -> torch.Tensor:
    return sum(((t >> b) & 1) for b in range(32))


# ------------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    "name",
    [
        *(f"model.layers.3.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"model.layers.12.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        "gpt_neox.layers.0.attention.query_key_value.weight",
        "gpt_neox.layers.0.attention.dense.weight",
        "gpt_neox.layers.1.mlp.dense_h_to_4h.weight",
        "gpt_neox.layers.1.mlp.dense_4h_to_h.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.weight",
        "transformer.h.10.mlp.c_fc.weight",
        "transformer.h.10.mlp.c_proj.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.weight",  # prefixes are allowed
    ],
)
def test_default_pattern_matches_block_matrices(name):
    assert re.search(DEFAULT_ELIGIBLE_PATTERN, name)


@pytest.mark.parametrize(
    "name",
    [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_feedforward_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight",  # OLMo2
        "model.layers.0.self_attn.q_proj.bias",  # Qwen2
        "gpt_neox.embed_in.weight",
        "gpt_neox.layers.0.attention.query_key_value.bias",
        "gpt_neox.final_layer_norm.weight",
        "embed_out.weight",
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight",
        "transformer.h.0.mlp.c_fc.bias",
        "model.layers.0.self_attn.q_proj.weight.extra",
        "model.layers.0.self_attn.q_proj.lora_A.weight",
    ],
)
def test_default_pattern_rejects_other_parameters(name):
    assert not re.search(DEFAULT_ELIGIBLE_PATTERN, name)


def test_layer_index_and_component():
    assert layer_index("model.layers.13.mlp.down_proj.weight") == 13
    assert layer_index("gpt_neox.layers.2.attention.dense.weight") == 2
    assert layer_index("transformer.h.7.attn.c_attn.weight") == 7
    assert layer_index("model.layers.5.input_layernorm.weight") == 5
    assert layer_index("model.embed_tokens.weight") is None
    assert layer_index("lm_head.weight") is None
    assert component("model.layers.0.self_attn.o_proj.weight") == "attention"
    assert component("model.layers.0.self_attn.k_proj.bias") == "attention"
    assert component("gpt_neox.layers.0.attention.query_key_value.weight") == "attention"
    assert component("transformer.h.0.attn.c_proj.weight") == "attention"
    assert component("model.layers.0.mlp.gate_proj.weight") == "mlp"
    assert component("gpt_neox.layers.0.mlp.dense_4h_to_h.weight") == "mlp"
    assert component("transformer.h.0.mlp.c_proj.weight") == "mlp"
    assert component("model.layers.0.self_attn.q_norm.weight") is None
    assert component("model.layers.0.post_attention_layernorm.weight") is None
    assert component("lm_head.weight") is None


# ------------------------------------------------------------------------------------------------
# Eligibility


def test_eligible_parameters_llama(llama_shapes):
    names = eligible_parameters(llama_shapes, NUM_LAYERS)
    expected = [
        f"model.layers.{layer}.{proj}.weight"
        for layer in (0, 1)
        for proj in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    assert names == expected  # named_parameters order, last two layers skipped


def test_eligible_parameters_gpt2_and_neox():
    gpt2 = {
        "transformer.wte.weight": (100, 8),
        "transformer.h.0.ln_1.weight": (8,),
        "transformer.h.0.attn.c_attn.weight": (8, 24),
        "transformer.h.0.attn.c_attn.bias": (24,),
        "transformer.h.0.attn.c_proj.weight": (8, 8),
        "transformer.h.0.mlp.c_fc.weight": (8, 32),
        "transformer.h.0.mlp.c_proj.weight": (32, 8),
        "transformer.h.1.attn.c_attn.weight": (8, 24),
        "transformer.ln_f.weight": (8,),
    }
    assert eligible_parameters(gpt2, 2, skip_last=1) == [
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_proj.weight",
        "transformer.h.0.mlp.c_fc.weight",
        "transformer.h.0.mlp.c_proj.weight",
    ]
    neox = {
        "gpt_neox.embed_in.weight": (100, 8),
        "gpt_neox.layers.0.attention.query_key_value.weight": (24, 8),
        "gpt_neox.layers.0.attention.dense.weight": (8, 8),
        "gpt_neox.layers.0.mlp.dense_h_to_4h.weight": (32, 8),
        "gpt_neox.layers.0.mlp.dense_4h_to_h.weight": (8, 32),
        "embed_out.weight": (100, 8),
    }
    assert eligible_parameters(neox, 1, skip_last=0) == list(neox)[1:5]


def test_no_matching_parameters_error():
    with pytest.raises(MaskError, match=r"no parameters matching the eligible pattern .*e\.g\. names: .*encoder\.w"):
        eligible_parameters({"encoder.w": (3, 3), "encoder.b": (3,)}, 2)


def test_all_matching_parameters_skipped_error(llama_shapes):
    with pytest.raises(MaskError, match="skipped last 4 of 4 layers"):
        eligible_parameters(llama_shapes, NUM_LAYERS, skip_last=4)


def test_layer_beyond_num_layers_error(llama_shapes):
    with pytest.raises(
        MaskError, match=r"'model\.layers\.2\.self_attn\.q_proj\.weight' is in layer 2 but num_layers=2"
    ):
        eligible_parameters(llama_shapes, 2)


@pytest.mark.parametrize("kwargs", [{"num_layers": 0}, {"num_layers": 4, "skip_last": -1}])
def test_eligible_parameters_argument_validation(llama_shapes, kwargs):
    with pytest.raises(MaskError):
        eligible_parameters(llama_shapes, **kwargs)


# ------------------------------------------------------------------------------------------------
# Construction


def test_masks_cover_only_eligible_tensors_with_parameter_shapes(llama_shapes, llama_masks):
    assert list(llama_masks.packed) == eligible_parameters(llama_shapes, NUM_LAYERS)
    for name, packed in llama_masks.packed.items():
        assert packed.dtype == torch.int32
        assert tuple(packed.shape) == llama_shapes[name]
        assert layer_index(name) in (0, 1)
        assert "norm" not in name and "embed" not in name and "lm_head" not in name


def test_groups_are_disjoint_and_within_num_groups(llama_masks):
    for packed in llama_masks.packed.values():
        assert int(_popcount(packed).max()) <= 1
        assert not bool(((packed >> llama_masks.num_groups) != 0).any())
    stats = trivial_mask_stats(llama_masks)
    assert stats["overlap_scalars"] == 0 and stats["disjoint"] and stats["stray_bit_scalars"] == 0


def test_group_sizes_match_budget_of_whole_model(llama_shapes, llama_masks):
    p_tot = sum(math.prod(s) for s in llama_shapes.values())
    p_act = sum(p.numel() for p in llama_masks.packed.values())
    rate = 0.05 * p_tot / p_act
    sigma = math.sqrt(p_act * rate * (1 - rate))
    totals = llama_masks.total_counts()
    assert len(totals) == 6
    for count in totals:
        assert abs(count - 0.05 * p_tot) < 5 * sigma
    stats = trivial_mask_stats(llama_masks, total_params=p_tot)
    for frac in stats["group_fraction_of_total"]:
        assert abs(frac - 0.05) < 5 * sigma / p_tot
    assert stats["eligible_scalars"] == p_act
    assert llama_masks.extra["total_params"] == str(p_tot)
    assert llama_masks.extra["eligible_params"] == str(p_act)


def test_reproducible_for_seed_and_different_for_other_seed(llama_shapes, llama_masks):
    rng_state = torch.get_rng_state()
    again = build_masks(llama_shapes, NUM_LAYERS, seed=42)
    assert torch.equal(torch.get_rng_state(), rng_state)  # uses its own generator
    other = build_masks(llama_shapes, NUM_LAYERS, seed=43)
    for name in llama_masks.packed:
        assert torch.equal(again.packed[name], llama_masks.packed[name])
    assert any(not torch.equal(other.packed[n], llama_masks.packed[n]) for n in llama_masks.packed)


def _reference_masks(shapes, eligible, num_groups, budget, seed):
    """Plain-loop reimplementation of the banding: one uniform per scalar, band = floor(r / a) in float32."""
    p_tot = sum(math.prod(s) for s in shapes.values())
    p_act = sum(math.prod(shapes[n]) for n in eligible)
    rate = np.float32(budget * (p_tot / p_act))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in eligible:
        draws = torch.rand(math.prod(shapes[name]), generator=gen).tolist()
        values = []
        for r in draws:
            band = math.floor(np.float32(r) / rate)
            bit = 1 << band if band < num_groups else 0
            values.append(bit - (1 << 32) if bit >= 1 << 31 else bit)  # int32 two's complement
        out[name] = values
    return out


@pytest.mark.parametrize(("num_groups", "budget"), [(3, 0.1), (6, 0.05), (32, 0.02)])
def test_banding_matches_brute_force_reference(num_groups, budget):
    shapes = {
        "model.embed_tokens.weight": (7, 3),
        "model.layers.0.self_attn.q_proj.weight": (9, 11),
        "model.layers.0.input_layernorm.weight": (3,),
        "model.layers.0.mlp.down_proj.weight": (13, 17),
        "model.layers.1.mlp.up_proj.weight": (19, 5),
        "model.layers.2.mlp.up_proj.weight": (19, 5),
        "model.norm.weight": (3,),
        "lm_head.weight": (7, 3),
    }
    built = build_masks(shapes, 3, num_groups=num_groups, budget=budget, seed=7, skip_last=1)
    eligible = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
    ]
    assert list(built.packed) == eligible
    reference = _reference_masks(shapes, eligible, num_groups, budget, seed=7)
    for name in eligible:
        assert built.packed[name].flatten().tolist() == reference[name]


def _release_create_masks(model, freeze_ratio, n_masks, seed, layers_to_skip, exclude_components):
    """Transcription of the released ``create_masks`` (element-wise branch) with global seeding."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        unfreeze_ratio = 1 - freeze_ratio
        total = sum(p.numel() for p in model.parameters())
        active, active_count = [], 0
        for name, param in model.named_parameters():
            match = re.search(r"layers\.(\d+)\.", name)
            skipped = (match and int(match.group(1)) in layers_to_skip) or any(e in name for e in exclude_components)
            if not skipped:
                active.append(name)
                active_count += param.numel()
        rate = unfreeze_ratio * (total / active_count)
        packed = {}
        for name, param in model.named_parameters():
            if name not in active:
                packed[name] = torch.zeros(param.numel(), dtype=torch.int32)
            else:
                band = (torch.rand(param.numel()) / rate).long()
                packed[name] = torch.where(
                    band < n_masks, (1 << band).to(torch.int32), torch.zeros(1, dtype=torch.int32)
                )
    return packed


def test_release_pattern_reproduces_released_create_masks():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=4, intermediate_size=64, vocab_size=100, num_attention_heads=4
    )
    model = transformers.LlamaForCausalLM(config)
    release = _release_create_masks(model, 0.95, 6, 42, [2, 3], ["norm", "embed_tokens"])
    ours = build_masks(named_shapes_of(model), 4, pattern=LACUNA_RELEASE_PATTERN, budget=1 - 0.95)
    assert "lm_head.weight" in ours.packed  # the release code masks an untied lm_head
    for name, flat in release.items():
        if name in ours.packed:
            assert torch.equal(ours.packed[name].flatten(), flat), name
        else:
            assert not bool(flat.any()), name


def test_budget_feasibility_error_mentions_both_fractions(llama_shapes):
    with pytest.raises(MaskError, match=r"require 120\.00% .* hold only 42\.32%"):
        build_masks(llama_shapes, NUM_LAYERS, budget=0.2)


@pytest.mark.parametrize("num_groups", [0, 33, 64])
def test_num_groups_out_of_range(llama_shapes, num_groups):
    with pytest.raises(MaskError, match=r"num_groups must be an integer in \[1, 32\]"):
        build_masks(llama_shapes, NUM_LAYERS, num_groups=num_groups, budget=0.001)


@pytest.mark.parametrize("budget", [0.0, -0.1, 1.5])
def test_budget_out_of_range(llama_shapes, budget):
    with pytest.raises(MaskError, match="budget must be a fraction"):
        build_masks(llama_shapes, NUM_LAYERS, budget=budget)


def test_build_masks_without_matching_names():
    with pytest.raises(MaskError, match="no parameters matching"):
        build_masks({"encoder.w": (3, 3)}, 2)


def test_default_groups_follow_num_groups(llama_shapes):
    four = build_masks(llama_shapes, NUM_LAYERS, num_groups=4)
    assert four.forget_groups == (0, 2) and four.retain_groups == (1, 3)
    six = build_masks(llama_shapes, NUM_LAYERS)
    assert six.forget_groups == (0, 2, 4) and six.retain_groups == (1, 3, 5)


# ------------------------------------------------------------------------------------------------
# Bit semantics


def _hand_made() -> MaskSet:
    values = torch.tensor([[0, 1, 2, 4], [8, 16, 32, -(2**31)], [5, 64, 3, 0]], dtype=torch.int32)
    return MaskSet(packed={"w": values}, num_groups=32)


def test_group_union_forget_retain_bits():
    ms = _hand_made()
    assert ms.forget_groups == tuple(range(0, 32, 2)) and ms.retain_groups == tuple(range(1, 32, 2))
    ms6 = MaskSet(packed=ms.packed, num_groups=32, forget_groups=(0, 2, 4), retain_groups=(1, 3, 5))
    assert ms.group("w", 0).tolist() == [
        [False, True, False, False],
        [False, False, False, False],
        [True, False, True, False],
    ]
    assert ms.group("w", 31).tolist() == [[False] * 4, [False, False, False, True], [False] * 4]
    assert ms.union("w", [2, 5]).tolist() == [
        [False, False, False, True],
        [False, False, True, False],
        [True, False, False, False],
    ]
    assert ms.union("w", []).sum() == 0
    assert ms6.forget_mask("w").tolist() == [
        [False, True, False, True],
        [False, True, False, False],
        [True, False, True, False],
    ]
    assert ms6.retain_mask("w").tolist() == [
        [False, False, True, False],
        [True, False, True, False],
        [False, False, True, False],
    ]
    assert ms6.union("w", (31,)).tolist() == ms.group("w", 31).tolist()


def test_unpack_pack_round_trip(llama_masks):
    for name, packed in llama_masks.packed.items():
        unpacked = llama_masks.unpack(name)
        assert unpacked.dtype == torch.bool
        assert tuple(unpacked.shape) == (llama_masks.num_groups, *packed.shape)
        repacked = sum(unpacked[g].to(torch.int32) << g for g in range(llama_masks.num_groups))
        assert torch.equal(repacked, packed)
    counts = llama_masks.counts()
    assert [sum(c[g] for c in counts.values()) for g in range(6)] == llama_masks.total_counts()
    first = next(iter(llama_masks.packed))
    assert counts[first] == [int(x) for x in llama_masks.unpack(first).sum(dim=(1, 2))]


def test_unpack_sign_bit_round_trip():
    ms = _hand_made()
    repacked = torch.zeros_like(ms.packed["w"])
    for g, plane in enumerate(ms.unpack("w")):
        repacked |= plane.to(torch.int32) << g
    assert torch.equal(repacked, ms.packed["w"])


def test_bit_accessor_errors():
    ms = _hand_made()
    with pytest.raises(MaskError, match="no mask for 'missing'"):
        ms.group("missing", 0)
    with pytest.raises(MaskError, match="group 32"):
        ms.group("w", 32)
    ms6 = MaskSet(packed={"w": torch.zeros(2, dtype=torch.int32)}, num_groups=6)
    with pytest.raises(MaskError, match="group 6"):
        ms6.union("w", [6])


def test_stats_report_overlap_and_stray_bits():
    ms = MaskSet(packed={"w": torch.tensor([5, 1, 64, 0], dtype=torch.int32)}, num_groups=6)
    stats = trivial_mask_stats(ms)
    assert stats["overlap_scalars"] == 1 and not stats["disjoint"]
    assert stats["stray_bit_scalars"] == 1
    assert stats["group_counts"] == [2, 0, 1, 0, 0, 0]


def test_maskset_validation():
    with pytest.raises(MaskError, match=r"mask for 'w' has dtype torch\.int64"):
        MaskSet(packed={"w": torch.zeros(3, dtype=torch.int64)})
    with pytest.raises(MaskError, match="forget_groups contains 6"):
        MaskSet(packed={}, num_groups=6, forget_groups=(0, 6))
    with pytest.raises(MaskError, match="overlap"):
        MaskSet(packed={}, num_groups=6, forget_groups=(0, 1), retain_groups=(1, 2))


# ------------------------------------------------------------------------------------------------
# check_against / reshape_to


def test_check_against_accepts_matching_model(llama_shapes, llama_masks):
    llama_masks.check_against(llama_shapes, "tiny llama")


def test_check_against_missing_tensor_names_it(llama_shapes, llama_masks):
    shapes = dict(llama_shapes)
    del shapes["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(MaskError, match=r"mask for 'model\.layers\.1\.mlp\.up_proj\.weight' has no matching .* in m2"):
        llama_masks.check_against(shapes, "m2")


def test_check_against_shape_mismatch_names_it(llama_shapes, llama_masks):
    shapes = dict(llama_shapes)
    shapes["model.layers.0.mlp.down_proj.weight"] = (64, 32)
    expected = (
        "mask for 'model.layers.0.mlp.down_proj.weight' has shape (32, 64) but parameter has shape (64, 32) in m3"
    )
    with pytest.raises(MaskError, match=re.escape(expected)):
        llama_masks.check_against(shapes, "m3")


# ------------------------------------------------------------------------------------------------
# safetensors files


def test_save_load_round_trip(tmp_path, llama_masks):
    llama_masks.extra["run"] = "unit-test"
    try:
        path = save_masks(llama_masks, tmp_path / "masks.safetensors")
    finally:
        del llama_masks.extra["run"]
    assert os.listdir(tmp_path) == ["masks.safetensors"]  # no temp file left behind
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
    assert meta["format"] == "lacuna-bench-masks" and meta["version"] == "2"
    assert meta["num_groups"] == "6" and meta["budget"] == "0.05" and meta["seed"] == "42"
    with safe_open(str(path), framework="pt") as fh:  # six groups fit in a byte: a quarter of int32's bytes
        assert {fh.get_slice(n).get_dtype() for n in fh.keys()} == {"U8"}
    assert meta["forget_groups"] == "0,2,4" and meta["retain_groups"] == "1,3,5"
    assert meta["run"] == "unit-test"
    loaded = load_masks(path)
    assert list(loaded.packed) == list(llama_masks.packed)  # order preserved
    for name, packed in llama_masks.packed.items():
        assert loaded.packed[name].dtype == torch.int32
        assert torch.equal(loaded.packed[name], packed)
    assert (loaded.num_groups, loaded.budget, loaded.seed) == (6, 0.05, 42)
    assert loaded.forget_groups == (0, 2, 4) and loaded.retain_groups == (1, 3, 5)
    assert loaded.extra == {**llama_masks.extra, "run": "unit-test"}


def test_save_overwrites_and_handles_unknown_budget(tmp_path):
    ms = MaskSet(packed={"w": torch.tensor([[1, 2], [0, 4]], dtype=torch.int32)}, num_groups=3)
    path = tmp_path / "sub" / "m.safetensors"
    save_masks(ms, path)
    save_masks(ms, path)
    loaded = load_masks(path, num_groups=3)
    assert loaded.budget is None and loaded.seed is None
    assert torch.equal(loaded.packed["w"], ms.packed["w"])
    assert sorted(os.listdir(path.parent)) == ["m.safetensors"]


def test_failed_save_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    ms = MaskSet(packed={"w": torch.ones(3, dtype=torch.int32)}, num_groups=2)
    path = save_masks(ms, tmp_path / "m.safetensors")
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)  # the atomic writer lacuna_metrics.manifest.save_tensors
    with pytest.raises(RuntimeError, match="disk full"):
        save_masks(MaskSet(packed={"w": torch.zeros(3, dtype=torch.int32)}, num_groups=2), path)
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert path.read_bytes() == before


def test_save_rejects_reserved_extra_keys(tmp_path):
    ms = MaskSet(packed={}, num_groups=2, extra={"format": "x"})
    with pytest.raises(MaskError, match="reserved"):
        save_masks(ms, tmp_path / "m.safetensors")


@pytest.mark.parametrize("name", ["junk.safetensors", "junk.pt", "junk"])
def test_random_bytes_raise_mask_error_naming_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 512, dtype=np.uint8).tobytes())
    with pytest.raises(MaskError, match=re.escape(str(path))):
        load_masks(path)


def test_missing_metadata_raises_naming_file(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(3, dtype=torch.int32)}, str(path))
    with pytest.raises(MaskError, match=re.escape(str(path)) + r": missing metadata keys"):
        load_masks(path)
    save_file({"w": torch.zeros(3, dtype=torch.int32)}, str(path), metadata={"format": "lacuna-bench-masks"})
    with pytest.raises(MaskError, match=r"missing metadata keys \['version', 'num_groups'"):
        load_masks(path)


def _metadata(**overrides: str) -> dict[str, str]:
    meta = {
        "format": "lacuna-bench-masks",
        "version": "1",
        "num_groups": "6",
        "budget": "0.05",
        "seed": "42",
        "forget_groups": "0,2,4",
        "retain_groups": "1,3,5",
    }
    meta.update(overrides)
    return meta


def test_wrong_dtype_names_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(2, dtype=torch.int32), "b.weight": torch.zeros(2)}, str(path), metadata=_metadata())
    with pytest.raises(MaskError, match=re.escape(str(path)) + r": tensor 'b\.weight' has dtype F32"):
        load_masks(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"format": "other"}, "format='other'"),
        ({"version": "3"}, "unsupported mask file version '3'"),
        ({"num_groups": "six"}, "malformed metadata"),
        ({"forget_groups": "0;2"}, "forget_groups='0;2'"),
        ({"num_groups": "2"}, "forget_groups contains 2"),
    ],
)
def test_malformed_metadata(tmp_path, overrides, message):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2, dtype=torch.int32)}, str(path), metadata=_metadata(**overrides))
    with pytest.raises(MaskError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        load_masks(path)


def test_num_groups_disagreement(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2, dtype=torch.int32)}, str(path), metadata=_metadata())
    with pytest.raises(MaskError, match="holds 6 groups but num_groups=4"):
        load_masks(path, num_groups=4)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="mask file not found"):
        load_masks(Path("/nonexistent/masks.safetensors"))


# ------------------------------------------------------------------------------------------------
# Released LACUNA mask.pt


def _write_mask_pt(path: Path, shapes, maskset: MaskSet) -> None:
    """Write a release-style mask.pt: every parameter, flat int32, zeros for skipped tensors."""
    flat = {
        name: maskset.packed[name].flatten().clone()
        if name in maskset.packed
        else torch.zeros(math.prod(shape), dtype=torch.int32)
        for name, shape in shapes.items()
    }
    torch.save(flat, path)


def test_mask_pt_load_and_reshape(tmp_path, llama_shapes, llama_masks):
    path = tmp_path / "mask.pt"
    _write_mask_pt(path, llama_shapes, llama_masks)
    loaded = load_masks(path)
    assert list(loaded.packed) == list(llama_shapes)  # zero vectors are kept
    assert all(p.dim() == 1 for p in loaded.packed.values())  # flat until reshape_to
    assert loaded.num_groups == 6 and loaded.budget is None and loaded.seed is None
    assert loaded.forget_groups == (0, 2, 4) and loaded.retain_groups == (1, 3, 5)
    assert loaded.nonzero_names() == list(llama_masks.packed)
    with pytest.raises(MaskError, match=r"'model\.embed_tokens\.weight' has shape \(3200,\) .*call reshape_to first"):
        loaded.check_against(llama_shapes, "tiny llama")
    shaped = loaded.reshape_to(llama_shapes)
    shaped.check_against(llama_shapes, "tiny llama")
    for name, shape in llama_shapes.items():
        assert tuple(shaped.packed[name].shape) == shape
        if name in llama_masks.packed:
            assert torch.equal(shaped.packed[name], llama_masks.packed[name])
            assert torch.equal(shaped.forget_mask(name), llama_masks.forget_mask(name))
        else:
            assert not bool(shaped.packed[name].any())
    assert shaped.total_counts() == llama_masks.total_counts()
    assert trivial_mask_stats(shaped)["group_counts"] == trivial_mask_stats(llama_masks)["group_counts"]
    assert all(p.dim() == 1 for p in loaded.packed.values())  # reshape_to returned a new set


def test_mask_pt_num_groups_override(tmp_path):
    path = tmp_path / "mask.pt"
    torch.save({"w": torch.tensor([1, 2, 0], dtype=torch.int32)}, path)
    loaded = load_masks(path, num_groups=2)
    assert loaded.num_groups == 2 and loaded.forget_groups == (0,) and loaded.retain_groups == (1,)


def test_mask_pt_numel_mismatch_names_tensor(tmp_path, llama_shapes, llama_masks):
    path = tmp_path / "mask.pt"
    _write_mask_pt(path, llama_shapes, llama_masks)
    shapes = dict(llama_shapes)
    shapes["model.layers.1.self_attn.k_proj.weight"] = (32, 32)
    with pytest.raises(MaskError, match=r"mask for 'model\.layers\.1\.self_attn\.k_proj\.weight' has 512 scalars"):
        load_masks(path).reshape_to(shapes)
    del shapes["model.norm.weight"]
    shapes["model.layers.1.self_attn.k_proj.weight"] = llama_shapes["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(MaskError, match=r"mask for 'model\.norm\.weight' has no matching parameter"):
        load_masks(path).reshape_to(shapes)


def test_mask_pt_wrong_dtype_names_tensor(tmp_path):
    path = tmp_path / "mask.pt"
    torch.save({"ok": torch.zeros(2, dtype=torch.int32), "bad.weight": torch.zeros(2, dtype=torch.int64)}, path)
    with pytest.raises(MaskError, match=re.escape(str(path)) + r": tensor 'bad\.weight' has dtype torch\.int64"):
        load_masks(path)


def test_mask_pt_not_a_dict(tmp_path):
    path = tmp_path / "mask.pt"
    torch.save([torch.zeros(2, dtype=torch.int32)], path)
    with pytest.raises(MaskError, match=re.escape(str(path)) + ": expected a dict"):
        load_masks(path)


class _NotATensor:
    pass


def test_mask_pt_is_loaded_weights_only(tmp_path):
    path = tmp_path / "mask.pt"
    torch.save({"w": _NotATensor()}, path)
    with pytest.raises(MaskError, match=re.escape(str(path)) + " could not be read as a LACUNA mask.pt"):
        load_masks(path)


def test_mask_pt_without_suffix_is_detected(tmp_path):
    path = tmp_path / "masks_release"
    torch.save({"w": torch.tensor([4], dtype=torch.int32)}, path)
    assert load_masks(path).packed["w"].tolist() == [4]


def test_version_1_int32_files_still_load(tmp_path):
    """Files written before the uint8 storage (version 1, int32) load and score unchanged."""
    path = tmp_path / "v1.safetensors"
    packed = torch.tensor([[1, 2], [0, 36]], dtype=torch.int32)
    save_file({"w": packed}, str(path), metadata=_metadata(version="1"))
    loaded = load_masks(path)
    assert loaded.packed["w"].dtype == torch.int32 and torch.equal(loaded.packed["w"], packed)
    reader = MaskReader(path)
    assert torch.equal(reader.read("w", (2, 2), 0, 2), packed)


def test_version_1_rejects_uint8(tmp_path):
    path = tmp_path / "v1.safetensors"
    save_file({"w": torch.zeros(2, dtype=torch.uint8)}, str(path), metadata=_metadata(version="1"))
    with pytest.raises(MaskError, match=re.escape(str(path)) + r".*'w' has dtype U8, expected I32"):
        load_masks(path)
    with pytest.raises(MaskError, match=re.escape(str(path)) + r".*'w' is torch.uint8, expected I32"):
        MaskReader(path)


@pytest.mark.parametrize(("num_groups", "stored"), [(1, "U8"), (8, "U8"), (9, "I32"), (32, "I32")])
def test_storage_is_the_narrowest_bit_field(tmp_path, num_groups, stored):
    top = 1 << (num_groups - 1)
    top = top - (1 << 32) if top >= 1 << 31 else top  # bit 31 is int32's sign bit
    packed = torch.tensor([0, 1, top, 0], dtype=torch.int32)
    ms = MaskSet(packed={"w": packed}, num_groups=num_groups, forget_groups=(0,), retain_groups=())
    path = save_masks(ms, tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as fh:
        assert fh.get_slice("w").get_dtype() == stored
    assert torch.equal(load_masks(path).packed["w"], packed)
    reader = MaskReader(path)
    assert torch.equal(reader.read("w", (4,), 0, 4).to(torch.int32), packed)
    assert (reader.read("w", (4,), 0, 4) & reader.forget_bits).ne(0).tolist() == [False, True, num_groups == 1, False]


# -- masks tied to their model (issue 17) ------------------------------------------------------------------------

FP_A = "sha256:" + "a" * 64
FP_B = "sha256:" + "b" * 64


def _small_masks() -> MaskSet:
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.mlp.up_proj.weight": (16, 8)}
    return build_masks(shapes, 1, skip_last=0, budget=0.1, seed=3)


def test_model_fingerprint_round_trips_and_is_reserved(tmp_path):
    masks = _small_masks()
    save_masks(masks, tmp_path / "m.safetensors", model_fingerprint=FP_A)
    loaded = load_masks(tmp_path / "m.safetensors")
    assert loaded.model_fingerprint == FP_A and "model_fingerprint" not in loaded.extra
    assert MaskReader(tmp_path / "m.safetensors").model_fingerprint == FP_A
    save_masks(masks, tmp_path / "plain.safetensors")
    assert load_masks(tmp_path / "plain.safetensors").model_fingerprint is None
    assert MaskReader(tmp_path / "plain.safetensors").model_fingerprint is None
    with pytest.raises(MaskError, match="not 'sha256:'"):
        save_masks(masks, tmp_path / "bad.safetensors", model_fingerprint="md5:1234")
    assert not (tmp_path / "bad.safetensors").exists()


def test_stamp_masks_rewrites_only_the_header_atomically(tmp_path):
    path = save_masks(_small_masks(), tmp_path / "m.safetensors")
    os.chmod(path, 0o640)
    before = load_masks(path)
    stamp_masks(path, FP_A)
    after = load_masks(path)
    assert after.model_fingerprint == FP_A
    assert list(after.packed) == list(before.packed)
    assert all(torch.equal(after.packed[n], before.packed[n]) for n in before.packed)
    assert (after.budget, after.seed, after.extra) == (before.budget, before.seed, before.extra)
    assert os.stat(path).st_mode & 0o777 == 0o640
    stamp_masks(path, FP_B)  # restamping replaces
    assert MaskReader(path).model_fingerprint == FP_B
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temp file left
    with safe_open(str(path), framework="pt") as fh:  # still a valid safetensors file for the Rust reader
        assert fh.metadata()["model_fingerprint"] == FP_B


def test_stamp_masks_refuses_foreign_files(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(MaskError, match="not a lacuna-bench-masks file"):
        stamp_masks(tmp_path / "model.safetensors", FP_A)
    torch.save({"w": torch.zeros(2, dtype=torch.int32)}, tmp_path / "mask.pt")
    with pytest.raises(MaskError, match="mask.pt cannot be stamped"):
        stamp_masks(tmp_path / "mask.pt", FP_A)
    with pytest.raises(MaskError, match="not 'sha256:'"):
        stamp_masks(tmp_path / "model.safetensors", "sha256:xyz")


@pytest.mark.parametrize("num_groups", [6, 10])
def test_reader_verify_gives_the_file_fingerprint(tmp_path, num_groups):
    from lacuna_metrics.weights.checkpoints import file_fingerprint

    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.mlp.up_proj.weight": (16, 8)}
    masks = build_masks(shapes, 1, skip_last=0, budget=0.05, seed=3, num_groups=num_groups)
    path = save_masks(masks, tmp_path / "m.safetensors", model_fingerprint=FP_A)
    assert MaskReader(path).verify() == file_fingerprint(path)
    if num_groups == 6:  # a mask.pt is read as LACUNA's six groups
        torch.save({n: t.reshape(-1) for n, t in masks.packed.items()}, tmp_path / "mask.pt")
        assert MaskReader(tmp_path / "mask.pt").verify() == file_fingerprint(tmp_path / "mask.pt")


@pytest.mark.parametrize(("value", "bit"), [(1 << 6, 6), (1 << 7, 7), (0b1100_0001, 7)])
def test_reader_verify_refuses_bits_beyond_num_groups(tmp_path, value, bit):
    masks = _small_masks()
    masks.packed["model.layers.0.mlp.up_proj.weight"].view(-1)[5] = value
    path = save_masks(masks, tmp_path / "m.safetensors")
    with pytest.raises(MaskError, match=rf"'model\.layers\.0\.mlp\.up_proj\.weight' sets bit {bit}, .*num_groups=6"):
        MaskReader(path).verify()
    torch.save({n: t.reshape(-1) for n, t in masks.packed.items()}, tmp_path / "mask.pt")
    with pytest.raises(MaskError, match=rf"sets bit {bit}"):
        MaskReader(tmp_path / "mask.pt").verify()


def test_verification_in_background_gives_the_fingerprint_or_the_error(tmp_path):
    """verify_in_background: the same fingerprint as verify(); a stray bit's error from check() once it has failed
    (check never waits) and from result()."""
    from lacuna_metrics.weights.checkpoints import file_fingerprint

    good = save_masks(_small_masks(), tmp_path / "good.safetensors")
    verification = MaskReader(good).verify_in_background()
    assert verification.result() == file_fingerprint(good)
    verification.check()  # done and passed: nothing to raise
    masks = _small_masks()
    masks.packed["model.layers.0.mlp.up_proj.weight"].view(-1)[5] = 1 << 7
    bad = save_masks(masks, tmp_path / "bad.safetensors")
    verification = MaskReader(bad).verify_in_background()
    with pytest.raises(MaskError, match="sets bit 7"):
        verification.result()
    with pytest.raises(MaskError, match="sets bit 7"):
        verification.check()


def test_reader_refuses_overlapping_groups(tmp_path):
    path = save_masks(_small_masks(), tmp_path / "m.safetensors")
    with pytest.raises(MaskError, match="overlap"):
        MaskReader(path, forget_groups=(0, 2), retain_groups=(2, 3))
    with pytest.raises(MaskError, match=r"not a group index in \[0, 6\)"):
        MaskReader(path, forget_groups=(0, 7))
