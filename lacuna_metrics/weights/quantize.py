"""Round-to-nearest weight quantization on the CPU, for the robustness of the metrics themselves (docs/meta.md,
"Robustness"): OpenUnlearning asks whether a metric stays put when the unlearned model is quantized, and finds that
4-bit quantization can bring forgotten facts back. bitsandbytes needs a GPU; a plain per-channel quantizer answers
the same question on a CPU.

Each 2-D weight of the transformer blocks is quantized per output channel (row), symmetric, to ``bits`` bits:
``scale = max |w_row| / (2^(bits-1) - 1)``, ``q = clamp(round(w / scale), -(2^(bits-1) - 1), 2^(bits-1) - 1)``, and
stored dequantized (``q * scale``) in the checkpoint's own dtype, so every reader loads it as it loads the original.
As bitsandbytes' defaults, the input embeddings and ``lm_head`` stay in full precision, as do norms and biases
(1-D). The checkpoint is read one tensor at a time.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["QUANT_BITS", "quantize_checkpoint", "quantize_rows"]

#: The widths the robustness check uses (OpenUnlearning: 8-bit and 4-bit).
QUANT_BITS = (8, 4)
#: Tensors left in full precision (bitsandbytes' defaults skip the output head; embeddings are not Linear layers).
_SKIP = ("embed_tokens", "wte", "wpe", "lm_head", "embed_out")


def quantize_rows(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """``weight`` (2-D) quantized per row, symmetric round-to-nearest to ``bits`` bits, returned dequantized in
    float32. A zero row stays zero."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer in [2, 16], got {bits!r}")
    if weight.dim() != 2:
        raise ValueError(f"quantize_rows: expected a 2-D weight, got shape {tuple(weight.shape)}")
    w = weight.detach().to(torch.float32)
    top = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=1, keepdim=True) / top
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(w / safe), -top, top)
    return torch.where(scale > 0, q * safe, torch.zeros_like(w))


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith(".weight") and not any(part in name for part in _SKIP)


def quantize_checkpoint(
    model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], bits: int
) -> dict[str, Any]:
    """Write ``model_dir`` quantized to ``bits`` bits (module docstring) as an HF checkpoint in ``out_dir``
    (``model.safetensors`` plus the model's config and tokenizer files); returns what was quantized."""
    from safetensors.torch import save_file

    from lacuna_metrics.weights.checkpoints import Checkpoint

    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an integer in [2, 16], got {bits!r}")
    source = Checkpoint(model_dir)
    out = Path(out_dir)
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    done, kept = [], []
    for name in source.names:
        if source.is_alias(name):
            continue
        stored, value = source.read_stored(name)  # as stored (written back as is) and as float32
        if _quantized(name, tuple(value.shape)):
            tensors[name] = quantize_rows(value, bits).to(stored.dtype).contiguous()
            done.append(name)
        else:
            tensors[name] = stored.clone().contiguous()
            kept.append(name)
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    for item in Path(model_dir).iterdir():  # config, generation config, tokenizer
        if item.is_file() and not item.name.endswith((".safetensors", ".bin", ".index.json")):
            shutil.copy2(item, partial / item.name)
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return {"bits": bits, "scheme": "rtn-per-row-symmetric", "quantized": len(done), "full_precision": kept}
