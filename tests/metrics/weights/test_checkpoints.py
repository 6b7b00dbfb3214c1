"""Tests for lacuna_metrics.weights.checkpoints: layouts, dtypes, row blocks, tied weights, pairing, malformed files."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError, TensorInfo, check_compatible
from lacuna_metrics.weights.pair_walk import PairWalk

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]


# -- helpers --------------------------------------------------------------------------------------


def _tensors(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """A small state dict with 2-D, 1-D, 3-D and 0-D tensors in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(11, 6, generator=g).to(dtype),
        "model.layers.0.mlp.up_proj.weight": torch.randn(9, 5, generator=g).to(dtype),
        "model.norm.weight": torch.randn(13, generator=g).to(dtype),
        "model.layers.0.conv.weight": torch.randn(4, 3, 2, generator=g).to(dtype),
        "model.scale": torch.randn((), generator=g).to(dtype),
    }


def _write_config(directory: Path, **fields) -> None:
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", **fields}))


def _tiny_llama(tie: bool, dtype: torch.dtype = torch.float32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype).eval()


def _model_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _write_raw_safetensors(path: Path, header: dict, data: bytes) -> Path:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def _assert_roundtrip(ckpt: Checkpoint, expected: dict[str, torch.Tensor]) -> None:
    assert set(expected) <= set(ckpt.names)
    for name, ref in expected.items():
        info = ckpt.info(name)
        assert isinstance(info, TensorInfo)
        assert info.dtype == ref.dtype, name
        assert ckpt.shape(name) == tuple(ref.shape), name
        raw = ckpt.read_raw(name)
        assert raw.dtype == ref.dtype, name
        assert torch.equal(raw, ref), name
        full = ckpt.read(name)
        assert full.dtype == torch.float32, name
        assert torch.equal(full, ref.to(torch.float32)), name


# -- layouts and dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_single_safetensors_file_roundtrip(tmp_path, dtype):
    tensors = _tensors(dtype)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path)
    assert set(ckpt.names) == set(tensors)
    assert ckpt.files == [tmp_path / "model.safetensors"]
    _assert_roundtrip(ckpt, tensors)
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert ckpt.total_bytes() == sum(t.numel() for t in tensors.values()) * itemsize
    assert ckpt.config() == {}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_direct_safetensors_file_path(tmp_path, dtype):
    tensors = _tensors(dtype, seed=1)
    path = tmp_path / "weights-anything.safetensors"
    save_file(tensors, str(path))
    ckpt = Checkpoint(path)
    assert ckpt.files == [path]
    assert set(ckpt.names) == set(tensors)
    _assert_roundtrip(ckpt, tensors)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_save_pretrained_single_and_sharded(tmp_path, dtype):
    model = _tiny_llama(tie=False, dtype=dtype)
    state = _model_state(model)
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="5KB")
    single, sharded = Checkpoint(tmp_path / "single"), Checkpoint(tmp_path / "sharded")
    assert len(single.files) == 1
    assert len(sharded.files) >= 2
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    for ckpt in (single, sharded):
        assert set(ckpt.names) == set(state)
        assert not any(ckpt.is_alias(n) for n in ckpt.names)
        _assert_roundtrip(ckpt, state)
    assert check_compatible({"single": single, "sharded": sharded}) == single.names
    # the two layouts spread the same tensors over different files
    assert {sharded.info(n).file for n in sharded.names} == set(sharded.files)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_hand_written_safetensors_index_over_three_shards(tmp_path, dtype):
    tensors = _tensors(dtype, seed=2)
    names = list(tensors)
    shards = {"a.safetensors": names[:2], "b.safetensors": names[2:4], "c.safetensors": names[4:]}
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(members, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ckpt = Checkpoint(tmp_path)
    assert sorted(p.name for p in ckpt.files) == sorted(shards)
    for shard, members in shards.items():
        for n in members:
            assert ckpt.info(n).file == tmp_path / shard
    _assert_roundtrip(ckpt, tensors)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pytorch_bin_single_file(tmp_path, dtype):
    tensors = _tensors(dtype, seed=3)
    torch.save(tensors, tmp_path / "pytorch_model.bin")
    ckpt = Checkpoint(tmp_path)
    assert ckpt.files == [tmp_path / "pytorch_model.bin"]
    assert set(ckpt.names) == set(tensors)
    _assert_roundtrip(ckpt, tensors)
    direct = Checkpoint(tmp_path / "pytorch_model.bin")
    _assert_roundtrip(direct, tensors)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_pytorch_bin_sharded_index(tmp_path, dtype):
    tensors = _tensors(dtype, seed=4)
    names = list(tensors)
    shards = {"pytorch_model-00001-of-00002.bin": names[:3], "pytorch_model-00002-of-00002.bin": names[3:]}
    weight_map = {}
    for shard, members in shards.items():
        torch.save({n: tensors[n] for n in members}, tmp_path / shard)
        weight_map.update(dict.fromkeys(members, shard))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ckpt = Checkpoint(tmp_path)
    assert sorted(p.name for p in ckpt.files) == sorted(shards)
    # alternate between shards so the one-shard cache is swapped back and forth
    for name in [names[0], names[4], names[1], names[3], names[2]]:
        assert torch.equal(ckpt.read_raw(name), tensors[name])
    _assert_roundtrip(ckpt, tensors)


def test_pytorch_bin_non_contiguous_tensor(tmp_path):
    base = torch.randn(6, 4)
    torch.save({"w": base.t(), "v": base[:, 1]}, tmp_path / "pytorch_model.bin")
    ckpt = Checkpoint(tmp_path)
    assert torch.equal(ckpt.read("w"), base.t())
    assert torch.equal(ckpt.read("w", 1, 3), base.t()[1:3])
    assert torch.equal(ckpt.read("v", 2, 5), base[2:5, 1])


def test_safetensors_and_bin_read_the_same_values(tmp_path):
    tensors = _tensors(torch.bfloat16, seed=5)
    (tmp_path / "st").mkdir()
    (tmp_path / "pt").mkdir()
    save_file(tensors, str(tmp_path / "st" / "model.safetensors"))
    torch.save(tensors, tmp_path / "pt" / "pytorch_model.bin")
    st, pt = Checkpoint(tmp_path / "st"), Checkpoint(tmp_path / "pt")
    assert sorted(check_compatible({"st": st, "pt": pt})) == sorted(tensors)
    for name in tensors:
        assert torch.equal(st.read(name), pt.read(name))


def test_int32_mask_tensors_read_raw(tmp_path):
    mask = torch.randint(-(2**31), 2**31 - 1, (7, 3), dtype=torch.int32)
    save_file({"mask": mask}, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path, masks=True)
    assert ckpt.read_raw("mask").dtype == torch.int32
    assert torch.equal(ckpt.read_raw("mask"), mask)
    assert torch.equal(ckpt.read_raw("mask", 2, 5), mask[2:5])


# -- row blocks -----------------------------------------------------------------------------------


def _check_blocks(ckpt: Checkpoint, name: str, full: torch.Tensor, block_elems: int) -> None:
    ranges = list(ckpt.iter_blocks(name, block_elems))
    rows = full.shape[0] if full.dim() else 1
    assert ranges, name
    assert ranges[0][0] == 0
    assert ranges[-1][1] == rows
    for (_, stop), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert stop == start  # contiguous: every row exactly once
    per_row = max(1, full[0].numel()) if full.dim() else 1
    for start, stop in ranges:
        assert stop > start
        # about block_elems scalars per block, but never less than one row
        assert (stop - start) == max(1, block_elems // per_row) or stop == rows
    if full.dim() == 0:
        assert ranges == [(0, 1)]
        assert torch.equal(ckpt.read(name, 0, 1), full.float())
        return
    blocks = [ckpt.read(name, a, b) for a, b in ranges]
    assert torch.equal(torch.cat(blocks), full.float())
    raw_blocks = [ckpt.read_raw(name, a, b) for a, b in ranges]
    assert all(b.dtype == full.dtype for b in raw_blocks)
    assert torch.equal(torch.cat(raw_blocks), full)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("block_elems", [1, 5, 6, 7, 13, 30, 10**6])
def test_iter_blocks_cover_every_row_once(tmp_path, fmt, block_elems):
    tensors = _tensors(torch.bfloat16, seed=6)
    if fmt == "safetensors":
        save_file(tensors, str(tmp_path / "model.safetensors"))
    else:
        torch.save(tensors, tmp_path / "pytorch_model.bin")
    ckpt = Checkpoint(tmp_path)
    for name, full in tensors.items():
        _check_blocks(ckpt, name, full, block_elems)


def test_read_row_ranges_and_bounds(tmp_path):
    w = torch.randn(10, 4)
    v = torch.randn(17)
    save_file({"w": w, "v": v}, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path)
    assert torch.equal(ckpt.read("w", 3, 7), w[3:7])
    assert torch.equal(ckpt.read("w", 9), w[9:])
    assert ckpt.read("w", 4, 4).shape == (0, 4)
    assert torch.equal(ckpt.read("v", 5, 11), v[5:11])
    assert ckpt.info("w").rows == 10 and ckpt.info("w").numel == 40
    for start, stop in [(-1, 3), (5, 3), (0, 11), (11, None)]:
        with pytest.raises(CheckpointError, match=r"'w'"):
            ckpt.read("w", start, stop)
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        ckpt.read("nope")


def test_read_raw_rejects_rows_out_of_range(tmp_path):
    """read_raw is "unchecked" for NaN/inf, but must not read past its tensor into the next one's bytes."""
    save_file({"a": torch.zeros(2, 3), "b": torch.ones(4, 3)}, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path)
    with pytest.raises(CheckpointError):
        ckpt.read_raw("a", 0, 5)


# -- tied weights ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_tied_lm_head_is_an_alias_of_the_embedding(tmp_path, sharded):
    model = _tiny_llama(tie=True, dtype=torch.bfloat16)
    kwargs = {"max_shard_size": "5KB"} if sharded else {}
    model.save_pretrained(tmp_path, **kwargs)
    ckpt = Checkpoint(tmp_path)
    assert len(ckpt.files) >= 2 if sharded else len(ckpt.files) == 1
    on_disk = {info.name for info in (ckpt.info(n) for n in ckpt.names)}
    assert "lm_head.weight" not in on_disk  # save_pretrained dropped it
    assert "lm_head.weight" in ckpt.names
    assert ckpt.is_alias("lm_head.weight")
    assert not ckpt.is_alias("model.embed_tokens.weight")
    assert ckpt.shape("lm_head.weight") == ckpt.shape("model.embed_tokens.weight")
    embedding = model.state_dict()["model.embed_tokens.weight"]
    assert torch.equal(ckpt.read_raw("lm_head.weight"), embedding)
    assert torch.equal(ckpt.read("lm_head.weight"), embedding.float())
    assert torch.equal(ckpt.read("lm_head.weight", 5, 9), embedding[5:9].float())
    # aliases are counted once in the read cost
    assert ckpt.total_bytes() == sum(t.numel() * 2 for k, t in model.state_dict().items() if k != "lm_head.weight")


def test_untied_checkpoint_without_lm_head_gets_no_alias(tmp_path):
    tensors = {"model.embed_tokens.weight": torch.randn(8, 4), "model.norm.weight": torch.randn(4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    _write_config(tmp_path, tie_word_embeddings=False)
    ckpt = Checkpoint(tmp_path)
    assert "lm_head.weight" not in ckpt.names
    assert not ckpt.is_alias("lm_head.weight")
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        ckpt.read("lm_head.weight")


def test_untied_model_keeps_its_own_lm_head(tmp_path):
    model = _tiny_llama(tie=False)
    model.save_pretrained(tmp_path)
    ckpt = Checkpoint(tmp_path)
    assert "lm_head.weight" in ckpt.names
    assert not ckpt.is_alias("lm_head.weight")
    assert ckpt.info("lm_head.weight").name == "lm_head.weight"
    assert torch.equal(ckpt.read("lm_head.weight"), model.state_dict()["lm_head.weight"])
    assert ckpt.names.count("lm_head.weight") == 1


def test_without_config_an_embedding_only_checkpoint_is_treated_as_tied(tmp_path):
    """No config.json: ``tie_word_embeddings`` defaults to True (the PretrainedConfig default)."""
    emb = torch.randn(8, 4)
    save_file({"transformer.wte.weight": emb, "h.0.w": torch.randn(4, 4)}, str(tmp_path / "model.safetensors"))
    ckpt = Checkpoint(tmp_path / "model.safetensors")
    assert ckpt.is_alias("lm_head.weight")
    assert ckpt.info("lm_head.weight").name == "transformer.wte.weight"
    assert torch.equal(ckpt.read("lm_head.weight"), emb)


def test_tied_alias_for_bin_checkpoint_and_direct_file(tmp_path):
    emb = torch.randn(8, 4)
    torch.save({"model.embed_tokens.weight": emb}, tmp_path / "pytorch_model.bin")
    _write_config(tmp_path, tie_word_embeddings=True)
    for ckpt in (Checkpoint(tmp_path), Checkpoint(tmp_path / "pytorch_model.bin")):
        assert ckpt.is_alias("lm_head.weight")
        assert torch.equal(ckpt.read("lm_head.weight"), emb)


# -- check_compatible -----------------------------------------------------------------------------


def _ckpt(directory: Path, tensors: dict[str, torch.Tensor]) -> Checkpoint:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    return Checkpoint(directory)


def test_check_compatible_identical_returns_names(tmp_path):
    tensors = _tensors(torch.float32)
    a = _ckpt(tmp_path / "a", tensors)
    b = _ckpt(tmp_path / "b", {k: v + 1 for k, v in tensors.items()})
    c = _ckpt(tmp_path / "c", {k: v.bfloat16() for k, v in tensors.items()})  # dtype may differ
    assert check_compatible({"orig": a, "unl": b, "bf16": c}) == a.names
    assert check_compatible({"orig": a}) == a.names


def test_check_compatible_missing_tensor(tmp_path):
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2), "y": torch.zeros(3)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(2)})
    with pytest.raises(CheckpointError) as err:
        check_compatible({"original": a, "unlearned": b})
    msg = str(err.value)
    assert "'y'" in msg and "unlearned" in msg and "lacks" in msg
    assert str(tmp_path / "b") in msg


def test_check_compatible_extra_tensor(tmp_path):
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(2), "extra.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        check_compatible({"original": a, "unlearned": b})
    msg = str(err.value)
    assert "'extra.weight'" in msg and "unlearned" in msg and "original" in msg


def test_check_compatible_shape_mismatch(tmp_path):
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2, 3), "y": torch.zeros(3)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(3, 2), "y": torch.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        check_compatible({"original": a, "unlearned": b})
    msg = str(err.value)
    assert "x" in msg and "original" in msg and "unlearned" in msg
    assert "[2, 3]" in msg and "[3, 2]" in msg
    assert "'y'" not in msg and "y:" not in msg


def test_check_compatible_lists_every_difference(tmp_path):
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2), "y": torch.zeros(3), "z": torch.zeros(4)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(5), "z": torch.zeros(4), "w": torch.zeros(1)})
    with pytest.raises(CheckpointError) as err:
        check_compatible({"A": a, "B": b})
    msg = str(err.value)
    assert "'y'" in msg and "'w'" in msg and "x:" in msg


def test_check_compatible_restricted_to_names(tmp_path):
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2), "y": torch.zeros(3), "z": torch.zeros(4)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(2), "y": torch.zeros(9), "extra": torch.zeros(1)})
    # y differs and z / extra are one-sided, but only x is asked for
    assert check_compatible({"A": a, "B": b}, names=["x"]) == ["x"]
    with pytest.raises(CheckpointError, match=r"'z'") as err:
        check_compatible({"A": a, "B": b}, names=["x", "z"])
    assert "B" in str(err.value)
    with pytest.raises(CheckpointError, match=r"y: A \[3\] vs B \[9\]"):
        check_compatible({"A": a, "B": b}, names=["y"])


def test_check_compatible_name_missing_from_the_reference(tmp_path):
    """A requested name that the *first* checkpoint lacks is a difference like any other: listed with its label."""
    a = _ckpt(tmp_path / "a", {"x": torch.zeros(2)})
    b = _ckpt(tmp_path / "b", {"x": torch.zeros(2), "z": torch.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        check_compatible({"original": a, "unlearned": b}, names=["z"])
    msg = str(err.value)
    assert "'z'" in msg
    assert "original" in msg  # the label of the checkpoint that lacks it


def test_check_compatible_with_tied_alias_on_one_side(tmp_path):
    emb = torch.randn(8, 4)
    a = _ckpt(tmp_path / "a", {"model.embed_tokens.weight": emb})
    _write_config(tmp_path / "a", tie_word_embeddings=True)
    a = Checkpoint(tmp_path / "a")
    b = _ckpt(tmp_path / "b", {"model.embed_tokens.weight": emb, "lm_head.weight": emb.clone()})
    assert sorted(check_compatible({"tied": a, "untied": b})) == ["lm_head.weight", "model.embed_tokens.weight"]


# -- NaN / inf ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_non_finite_values_are_errors(tmp_path, bad, fmt):
    w = torch.randn(6, 4).bfloat16()
    w[4, 2] = bad
    tensors = {"model.layers.0.mlp.down_proj.weight": w, "ok": torch.randn(3)}
    file = tmp_path / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")
    if fmt == "safetensors":
        save_file(tensors, str(file))
    else:
        torch.save(tensors, file)
    ckpt = Checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as err:
        ckpt.read("model.layers.0.mlp.down_proj.weight")
    msg = str(err.value)
    assert str(file) in msg and "'model.layers.0.mlp.down_proj.weight'" in msg
    with pytest.raises(CheckpointError, match="down_proj"):
        ckpt.read("model.layers.0.mlp.down_proj.weight", 3, 5)
    # rows without the bad value read fine; check_finite=False skips the check
    assert torch.equal(ckpt.read("model.layers.0.mlp.down_proj.weight", 0, 4), w[:4].float())
    got = ckpt.read("model.layers.0.mlp.down_proj.weight", check_finite=False)
    torch.testing.assert_close(got, w.float(), rtol=0, atol=0, equal_nan=True)
    raw = ckpt.read_raw("model.layers.0.mlp.down_proj.weight")
    torch.testing.assert_close(raw, w, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(ckpt.read("ok"), tensors["ok"])


# -- malformed inputs -----------------------------------------------------------------------------


def test_nonexistent_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Checkpoint(tmp_path / "nowhere")


def test_empty_directory(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        Checkpoint(tmp_path)


def test_directory_with_only_a_config(tmp_path):
    _write_config(tmp_path, tie_word_embeddings=True)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        Checkpoint(tmp_path)


def test_truncated_safetensors_file(tmp_path):
    file = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(64, 8), "b": torch.randn(32)}, str(file))
    data = file.read_bytes()
    file.write_bytes(data[:-100])
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value)
    # cut inside the header
    file.write_bytes(data[:20])
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        Checkpoint(tmp_path)
    # shorter than the 8-byte length prefix
    file.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="shorter than 8 bytes"):
        Checkpoint(file)


@pytest.mark.parametrize(
    "content",
    [
        b"\x13\x37" * 4 + b"\xff" * 64,  # length prefix far beyond the file size
        struct.pack("<Q", 0) + b"{}",  # zero-length header
        struct.pack("<Q", 16) + b"\xff\xfe not json  ",  # header bytes that are not UTF-8 JSON
        struct.pack("<Q", 12) + b"hello world!",  # UTF-8 but not JSON
        struct.pack("<Q", 2) + b"[]",  # JSON but not an object
    ],
    ids=["random-length", "zero-length", "not-utf8", "not-json", "not-object"],
)
def test_garbage_safetensors_header(tmp_path, content):
    file = tmp_path / "model.safetensors"
    file.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value)


@pytest.mark.parametrize("dtype_name", ["I8", "BOOL", "U8", "F8_E4M3"])
def test_unsupported_dtype_in_header(tmp_path, dtype_name):
    file = _write_raw_safetensors(
        tmp_path / "model.safetensors",
        {
            "ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "x.weight": {"dtype": dtype_name, "shape": [2, 3], "data_offsets": [8, 14]},
        },
        bytes(14),
    )
    with pytest.raises(CheckpointError) as err:  # integer weights are refused by name (integer buffers skipped)
        Checkpoint(tmp_path)
    msg = str(err.value)
    assert str(file) in msg and "'x.weight'" in msg and dtype_name in msg


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]},  # 20 bytes for 6 floats
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 28]},  # too many, past the end of the file
        {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 24]},  # right size for F32, not F16
        {"dtype": "F32", "shape": [3, 3], "data_offsets": [0, 24]},
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 32]},  # right size, but ends past the file
    ],
)
def test_data_offsets_inconsistent_with_shape(tmp_path, entry):
    file = _write_raw_safetensors(tmp_path / "model.safetensors", {"w": entry}, bytes(24))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    msg = str(err.value)
    assert str(file) in msg and "'w'" in msg


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": "F32", "shape": [2, 3]},  # no data_offsets
        {"shape": [2, 3], "data_offsets": [0, 24]},  # no dtype
        {"dtype": "F32", "shape": "2x3", "data_offsets": [0, 24]},
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [0]},
        [1, 2, 3],
    ],
    ids=["no-offsets", "no-dtype", "bad-shape", "one-offset", "not-an-object"],
)
def test_malformed_header_entries(tmp_path, entry):
    file = _write_raw_safetensors(tmp_path / "model.safetensors", {"w": entry}, bytes(24))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value) and "'w'" in str(err.value)


def test_non_numeric_data_offsets(tmp_path):
    file = _write_raw_safetensors(
        tmp_path / "model.safetensors", {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": ["0", "24"]}}, bytes(24)
    )
    with pytest.raises(CheckpointError) as err:  # not a bare TypeError from the offset arithmetic
        Checkpoint(tmp_path)
    assert str(file) in str(err.value) and "'w'" in str(err.value)


def test_negative_data_offset(tmp_path):
    """Offsets are relative to the end of the header: a negative start would read header bytes as tensor data."""
    values = torch.arange(6, dtype=torch.float32)
    file = _write_raw_safetensors(
        tmp_path / "model.safetensors",
        {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [-8, 16]}},
        values.numpy().tobytes(),
    )
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value) and "'w'" in str(err.value)


def _sharded_dir(tmp_path: Path) -> dict[str, torch.Tensor]:
    tensors = {"a": torch.randn(3), "b": torch.randn(4)}
    save_file({"a": tensors["a"]}, str(tmp_path / "s1.safetensors"))
    save_file({"b": tensors["b"]}, str(tmp_path / "s2.safetensors"))
    return tensors


@pytest.mark.parametrize(
    "index_text, pattern",
    [
        ('{"weight_map": {"a": "s1.safetensors",', "malformed JSON"),
        ('{"metadata": {}}', "weight_map"),
        ('{"weight_map": {}}', "weight_map"),
        ('{"weight_map": ["s1.safetensors"]}', "weight_map"),
        ("[1, 2]", "weight_map"),
        ('{"weight_map": {"a": "s1.safetensors", "b": "missing.safetensors"}}', "missing.safetensors"),
    ],
    ids=["truncated-json", "no-weight-map", "empty-weight-map", "list-weight-map", "not-object", "missing-shard"],
)
def test_malformed_safetensors_index(tmp_path, index_text, pattern):
    _sharded_dir(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(index_text)
    with pytest.raises(CheckpointError, match=pattern) as err:
        Checkpoint(tmp_path)
    assert str(index) in str(err.value)


def test_index_entry_whose_shard_lacks_the_tensor(tmp_path):
    """weight_map says 'c' lives in s2.safetensors, but s2 holds no 'c': an error, not a checkpoint without 'c'."""
    _sharded_dir(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert "'c'" in str(err.value) and "s2.safetensors" in str(err.value)


def test_missing_bin_shard(tmp_path):
    torch.save({"a": torch.zeros(2)}, tmp_path / "pytorch_model-00001-of-00002.bin")
    weight_map = {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}
    index = tmp_path / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="pytorch_model-00002-of-00002.bin") as err:
        Checkpoint(tmp_path)
    assert str(index) in str(err.value) and "'b'" in str(err.value)


def test_tensor_in_two_shards(tmp_path):
    save_file({"a": torch.zeros(2), "dup": torch.zeros(3)}, str(tmp_path / "s1.safetensors"))
    save_file({"b": torch.zeros(2), "dup": torch.ones(3)}, str(tmp_path / "s2.safetensors"))
    weight_map = {"a": "s1.safetensors", "dup": "s1.safetensors", "b": "s2.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="appears in s1.safetensors and s2.safetensors") as err:
        Checkpoint(tmp_path)
    assert "'dup'" in str(err.value) and str(tmp_path) in str(err.value)


@pytest.mark.parametrize(
    "obj",
    [[torch.zeros(2)], {"state_dict": {"a": torch.zeros(2)}}, torch.zeros(3), {"a": 1.5}, {}],
    ids=["list", "nested", "bare-tensor", "non-tensor-value", "empty"],
)
def test_bin_that_is_not_a_state_dict(tmp_path, obj):
    file = tmp_path / "pytorch_model.bin"
    torch.save(obj, file)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_bin_with_garbage_bytes_or_unsupported_dtype(tmp_path):
    file = tmp_path / "pytorch_model.bin"
    file.write_bytes(b"definitely not a pickle" * 10)
    with pytest.raises(CheckpointError, match="not a PyTorch zip archive") as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value)
    torch.save({"m.weight": torch.zeros(3, dtype=torch.int8)}, file)
    with pytest.raises(CheckpointError, match="'m.weight'") as err:
        Checkpoint(tmp_path)
    assert str(file) in str(err.value)


def test_malformed_config_json(tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        Checkpoint(tmp_path)


# -- fingerprint ----------------------------------------------------------------------------------


def test_fingerprint_stable_and_sensitive(tmp_path):
    tensors = _tensors(torch.float32, seed=7)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fp1 = Checkpoint(tmp_path).fingerprint()
    fp2 = Checkpoint(tmp_path).fingerprint()
    assert fp1 == fp2
    assert fp1.startswith("sha256:") and len(fp1) == len("sha256:") + 64
    changed = dict(tensors)
    w = changed["model.layers.0.mlp.up_proj.weight"].clone()
    w[3, 2] += 1.0
    changed["model.layers.0.mlp.up_proj.weight"] = w
    save_file(changed, str(tmp_path / "model.safetensors"))
    fp3 = Checkpoint(tmp_path).fingerprint()
    assert fp3.startswith("sha256:") and fp3 != fp1
    save_file(tensors, str(tmp_path / "model.safetensors"))  # restoring the values restores the fingerprint
    assert Checkpoint(tmp_path).fingerprint() == fp1


def test_fingerprint_sharded_and_large_file(tmp_path):
    model = _tiny_llama(tie=False)
    model.save_pretrained(tmp_path / "m", max_shard_size="5KB")
    assert Checkpoint(tmp_path / "m").fingerprint() == Checkpoint(tmp_path / "m").fingerprint()
    # > 2 MiB: first and last MiB are hashed, so a change in the last tensor is seen
    big = {"a": torch.zeros(300_000), "z": torch.zeros(300_000)}
    (tmp_path / "big").mkdir()
    save_file(big, str(tmp_path / "big" / "model.safetensors"))
    before = Checkpoint(tmp_path / "big").fingerprint()
    big["z"][-1] = 1.0
    save_file(big, str(tmp_path / "big" / "model.safetensors"))
    assert Checkpoint(tmp_path / "big").fingerprint() != before


@pytest.mark.parametrize("layout", ["sharded-bf16-tied", "bin", "fp32-single"])
@pytest.mark.parametrize("threads", [1, 3])
def test_walk_streamed_fingerprints_equal_the_hashed_ones(tmp_path, layout, threads):
    """The pair walk hashes before/after from its own reads: the same fingerprint as hashing the files."""
    if layout == "sharded-bf16-tied":
        _tiny_llama(tie=True, dtype=torch.bfloat16).save_pretrained(tmp_path / "a", max_shard_size="5KB")
        _tiny_llama(tie=True, dtype=torch.bfloat16, seed=1).save_pretrained(tmp_path / "b", max_shard_size="5KB")
    else:
        for label, seed in (("a", 0), ("b", 1)):
            (tmp_path / label).mkdir()
            if layout == "bin":
                torch.save(_tensors(torch.float16, seed), tmp_path / label / "pytorch_model.bin")
            else:
                save_file(_tensors(torch.float32, seed), str(tmp_path / label / "model.safetensors"))
    walk = PairWalk(Checkpoint(tmp_path / "a"), Checkpoint(tmp_path / "b"), block_elems=17, threads=threads)
    walk.stream_fingerprints()
    assert walk.streamed == ("before", "after")
    walk.run()
    assert walk.fingerprint("before") == Checkpoint(tmp_path / "a").fingerprint()
    assert walk.fingerprint("after") == Checkpoint(tmp_path / "b").fingerprint()
    assert walk.before.fingerprint() == walk.fingerprint("before")  # cached on the checkpoint


def test_streamed_fingerprint_hashes_unseen_or_disordered_tensors_from_the_file(tmp_path):
    from lacuna_metrics.weights.pair_walk import StreamedFingerprint

    save_file(_tensors(torch.bfloat16, seed=3), str(tmp_path / "model.safetensors"))
    expected = Checkpoint(tmp_path).fingerprint()
    ckpt = Checkpoint(tmp_path)
    streamed = StreamedFingerprint(ckpt)
    name = "model.layers.0.self_attn.q_proj.weight"  # 11 rows
    streamed.update(name, 0, 4, ckpt.read_raw(name, 0, 4))
    streamed.update(name, 8, 11, ckpt.read_raw(name, 8, 11))  # rows 4-8 skipped: this tensor is hashed again
    other = "model.norm.weight"
    streamed.update(other, 0, 13, ckpt.read_raw(other, 0, 13))
    assert streamed.finish() == expected  # every other tensor was never fed


# -- the pair walk (lacuna_metrics.weights.pair_walk) -------------------------------------------------------


def _walk_pair_files(tmp_path):
    before = {"w": torch.randn(50, 7), "v": torch.randn(13)}
    after = {k: t + 1 for k, t in before.items()}
    for label, tensors in (("before", before), ("after", after)):
        (tmp_path / label).mkdir()
        save_file(tensors, str(tmp_path / label / "model.safetensors"))
    return Checkpoint(tmp_path / "before"), Checkpoint(tmp_path / "after"), before, after


@pytest.mark.parametrize("threads", [1, 3])
def test_walk_feeds_hooks_every_block_in_file_order(tmp_path, threads):
    ckb, cka, before, after = _walk_pair_files(tmp_path)
    walk = PairWalk(ckb, cka, block_elems=20, threads=threads)
    seen, progress = [], []
    walk.add_hook(lambda name, o, u: seen.append((name, o.clone(), u.clone())))  # blocks are reused buffers
    walk.add_progress(progress.append)
    walk.run()
    expected = [(n, s) for n in ckb.names for s, _ in ckb.iter_blocks(n, 20)]
    assert [n for n, _, _ in seen] == [n for n, _ in expected]
    for name in before:
        assert torch.equal(torch.cat([o.reshape(-1) for n, o, _ in seen if n == name]), before[name].reshape(-1))
        assert torch.equal(torch.cat([u.reshape(-1) for n, _, u in seen if n == name]), after[name].reshape(-1))
    assert sum(progress) == sum(t.numel() for t in before.values())


@pytest.mark.parametrize("threads", [1, 3])
def test_walk_raises_the_first_failed_block_in_file_order(tmp_path, threads):
    ckb, cka, _before, _after = _walk_pair_files(tmp_path)
    walk = PairWalk(ckb, cka, block_elems=7, threads=threads)
    seen = []
    walk.add_hook(lambda name, o, u: seen.append(name))

    def read(blk):
        if blk.seq in (2, 4):
            time.sleep(0.05 if blk.seq == 2 else 0.0)  # the later failure finishes first
            raise CheckpointError(f"bad block {blk.seq}")
        return walk.read_pair(blk)

    with walk.session(), pytest.raises(CheckpointError, match="bad block 2"):
        walk.run_blocks(walk.plan(ckb.names), read, None, hooks=True)
    assert len(seen) >= 2  # the blocks before the failure reached the hooks, in order


@pytest.mark.parametrize("threads", [1, 3])
def test_walk_guard_error_stops_the_walk_before_the_next_read(tmp_path, threads):
    """A guard (a check running beside the walk, e.g. the mask file's verification) that fails stops the walk: no
    block is read after the failure is seen, and its error is raised."""
    ckb, cka, _before, _after = _walk_pair_files(tmp_path)
    walk = PairWalk(ckb, cka, block_elems=1, threads=threads)
    failed, reads = threading.Event(), []
    walk.add_hook(lambda name, o, u: failed.set() if len(reads) >= 5 else None)

    def guard():
        if failed.is_set():
            raise ValueError("stray bit seen by the verification")

    walk.add_guard(guard)

    def read(blk):
        reads.append(blk.seq)
        return walk.read_pair(blk)

    with walk.session(), pytest.raises(ValueError, match="stray bit"):
        walk.run_blocks(walk.plan(ckb.names), read, None, hooks=True)
    assert len(reads) < 5 + threads + 2 < len(walk.plan(ckb.names))  # stopped, not read to the end


def test_walk_hook_exception_does_not_hang(tmp_path):
    ckb, cka, _before, _after = _walk_pair_files(tmp_path)
    walk = PairWalk(ckb, cka, block_elems=1, threads=3)
    calls = []

    def hook(name, o, u):
        calls.append(name)
        if len(calls) == 5:
            raise KeyError("boom in a hook")

    walk.add_hook(hook)
    threads_before = threading.active_count()
    t0 = time.monotonic()
    with pytest.raises(KeyError, match="boom in a hook"):
        walk.run()
    assert time.monotonic() - t0 < 5
    assert len(calls) < 50 + 13  # the walk stopped instead of reading every block
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= threads_before


# -- memory ---------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB on Linux")
def test_block_reads_of_a_64mb_tensor_keep_rss_low(tmp_path):
    """Reading a 64 MB fp32 tensor in 1M-element blocks must not pull the whole tensor into memory."""
    rows, cols = 4096, 4096  # 16M float32 = 64 MB
    path = tmp_path / "big.safetensors"
    save_file({"w": torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)}, str(path))
    # a fresh process that only reads, so its peak RSS is not already inflated by writing the tensor
    script = textwrap.dedent(
        """
        import resource, sys
        import torch
        from lacuna_metrics.weights.checkpoints import Checkpoint

        ckpt = Checkpoint(sys.argv[1])
        rows, cols = ckpt.shape("w")
        total = torch.zeros((), dtype=torch.float64)
        total += ckpt.read("w", 0, 1).double().sum()  # warm up allocator and kernels
        total.zero_()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        n = 0
        for start, stop in ckpt.iter_blocks("w", 1 << 20):
            block = ckpt.read("w", start, stop)
            n += block.numel()
            total += block.double().sum()
            del block
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert n == rows * cols, n
        expected = (rows * cols - 1) * rows * cols / 2
        assert float(total) == expected, (float(total), expected)
        print(after - before)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    grown_kib = int(out.stdout.strip().splitlines()[-1])
    # a whole-tensor read (or a memory map kept resident) would add ~64 MB; 4 MB blocks + float64 copies ~12 MB
    assert grown_kib < 40 * 1024, f"peak RSS grew by {grown_kib} KiB while reading 64 MB in 4 MB blocks"


# -- integer tensors and legacy pickles (issue 17) --------------------------------------------------------------


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool])
def test_integer_weight_is_refused_by_name(tmp_path, layout, dtype):
    tensors = _tensors(torch.float32)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.ones(9, 5).to(dtype)
    if layout == "safetensors":
        save_file(tensors, str(tmp_path / "model.safetensors"))
    else:
        torch.save(tensors, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' is a weight stored as"):
        Checkpoint(tmp_path)


@pytest.mark.parametrize("layout", ["safetensors", "bin"])
def test_integer_buffers_are_skipped_and_left_out_of_the_fingerprint(tmp_path, layout):
    floats = _tensors(torch.float32)
    buffers = {
        "embeddings.position_ids": torch.arange(12).reshape(1, 12),  # int64, 2-D: a buffer, not a weight
        "transformer.h.0.attn.bias": torch.ones(1, 1, 4, 4, dtype=torch.bool),  # GPT-Neo's causal mask
    }
    for name, state in (("plain", floats), ("buffered", {**floats, **buffers})):
        (tmp_path / name).mkdir()
        if layout == "safetensors":
            save_file(state, str(tmp_path / name / "model.safetensors"))
        else:
            torch.save(state, tmp_path / name / "pytorch_model.bin")
    plain, buffered = Checkpoint(tmp_path / "plain"), Checkpoint(tmp_path / "buffered")
    assert buffered.names == plain.names
    assert set(buffered.skipped) == set(buffers) and not plain.skipped
    assert buffered.fingerprint() == plain.fingerprint()


def test_legacy_non_zip_bin_is_refused_with_the_conversion(tmp_path):
    torch.save(_tensors(torch.float32), tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy \\(non-zip\\) PyTorch format.*save_pretrained"):
        Checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match="not a PyTorch zip archive"):
        Checkpoint(tmp_path)


def _two_layout_dir(tmp_path, single: str, index: str | None, other: str | None = None):
    """A directory with ``model.safetensors``-style single file(s) and/or an index with its shard, each holding a
    different value of one tensor, so the file a reader chose shows in what it reads."""
    import json

    from safetensors.torch import save_file

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))

    def write(name: str, value: float) -> None:
        t = {"w": torch.full((2, 2), value)}
        if name.endswith(".bin"):
            torch.save(t, d / name)
        else:
            save_file(t, str(d / name))

    write(single, 1.0)
    if other:
        write(other, 3.0)
    if index:
        shard = "model-00001-of-00001.safetensors" if "safetensors" in index else "pytorch_model-00001-of-00001.bin"
        write(shard, 2.0)
        (d / index).write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    return d


@pytest.mark.parametrize(
    ("single", "index"),
    [("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json")],
)
def test_a_directory_with_two_layouts_of_one_format_is_refused_naming_both(tmp_path, single, index):
    d = _two_layout_dir(tmp_path, single, index)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(d).names  # noqa: B018
    assert single in str(err.value) and index in str(err.value) and str(d) in str(err.value)


@pytest.mark.parametrize(
    ("single", "index", "other", "expected"),
    [
        ("model.safetensors", None, "pytorch_model.bin", 1.0),  # safetensors before PyTorch
        ("pytorch_model.bin", "model.safetensors.index.json", None, 2.0),  # a safetensors index before a .bin
    ],
)
def test_the_reader_takes_the_file_from_pretrained_takes(tmp_path, single, index, other, expected):
    d = _two_layout_dir(tmp_path, single, index, other)
    ckpt = Checkpoint(d)
    assert float(ckpt.read("w")[0, 0]) == expected
