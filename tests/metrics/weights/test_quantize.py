"""Round-to-nearest per-row quantization (lacuna_metrics/weights/quantize.py) against a brute-force loop, its
error bound, and the checkpoint writer on a tiny saved model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lacuna_metrics.weights.quantize import quantize_checkpoint, quantize_rows


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantize_rows_matches_a_loop_and_bounds_the_error(bits):
    torch.manual_seed(bits)
    w = torch.randn(5, 7)
    w[2] = 0.0  # a zero row stays zero
    out = quantize_rows(w, bits)
    top = 2 ** (bits - 1) - 1
    for i in range(5):
        scale = max(abs(float(v)) for v in w[i]) / top
        for j in range(7):
            expect = 0.0 if scale == 0 else max(-top, min(top, round(float(w[i, j]) / scale))) * scale
            assert float(out[i, j]) == pytest.approx(expect, abs=1e-6)
            if scale:
                assert abs(float(out[i, j]) - float(w[i, j])) <= scale / 2 + 1e-6
    assert torch.equal(quantize_rows(out, bits), out)  # already on the grid
    assert len(torch.unique(out[0])) <= 2 * top + 1


def test_quantize_rows_refuses_bad_input():
    with pytest.raises(ValueError, match="bits"):
        quantize_rows(torch.ones(2, 2), 1)
    with pytest.raises(ValueError, match="bits"):
        quantize_rows(torch.ones(2, 2), True)
    with pytest.raises(ValueError, match="2-D"):
        quantize_rows(torch.ones(3), 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_checkpoint_keeps_embeddings_norms_and_dtype(tmp_path, dtype):
    torch.manual_seed(0)
    state = {
        "model.embed_tokens.weight": torch.randn(10, 4),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4),
        "model.layers.0.mlp.down_proj.weight": torch.randn(4, 8),
        "model.layers.0.input_layernorm.weight": torch.randn(4),
        "lm_head.weight": torch.randn(10, 4),
    }
    state = {k: v.to(dtype) for k, v in state.items()}
    src = tmp_path / "model"
    src.mkdir()
    save_file(state, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    info = quantize_checkpoint(src, tmp_path / "q4", 4)
    out = load_file(str(tmp_path / "q4" / "model.safetensors"))
    assert info["quantized"] == 2 and (tmp_path / "q4" / "config.json").is_file()
    for name, value in state.items():
        assert out[name].dtype == dtype
        if "proj" in name:
            assert torch.equal(out[name], quantize_rows(value, 4).to(dtype))
            assert not torch.equal(out[name], value)
        else:
            assert torch.equal(out[name], value), name
    assert not (tmp_path / "q4.partial").exists()
