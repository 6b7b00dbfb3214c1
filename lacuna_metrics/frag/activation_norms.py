"""Per-channel input activation norms x_j of the scored projections, measured on a loaded model
(docs/definitions.md#frag-activation-statistics).

FRAG weighs each weight W_ij by how much its input channel j fires on forget text versus retain text: x_j is the L2
norm of channel j over the tokens of one calibration sequence, averaged over sequences. Forward pre-hooks observe each
scored module's input; a fused ``[num_experts, d_out, d_in]`` parameter gets one vector per expert, from the tokens
routed to it (docs/anatomy.md, "FRAG"). Caching and checkpoint names are :mod:`lacuna_metrics.frag.activations`' business.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from lacuna_metrics.frag.targets import frag_weights
from lacuna_metrics.weights.anatomy import Weight
from lacuna_tasks import progress

__all__ = ["collect_input_norms", "eval_mode", "model_device"]


def _model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a parameterless module)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Evaluation mode inside the block, the previous train/eval mode restored after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def collect_input_norms(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    target: str = "all",
    max_length: int = 256,
    dtype: torch.dtype | None = torch.bfloat16,
) -> dict[str, torch.Tensor]:
    """x_j = (1/N) sum_n ||X^(n)_{:,j}||_2 for every scored weight, keyed by parameter name
    (docs/definitions.md#frag-activation-statistics).

    Each text is tokenized on its own (truncation at ``max_length``, batch size 1, no padding, the tokenizer's
    special tokens) and run through ``model`` under ``torch.no_grad``; forward pre-hooks capture each scored
    layer's input X (T x d_in). Norms are taken in float32 and summed in float64, so only the forward pass runs in
    ``dtype``. If the model is not already in ``dtype`` it is converted IN PLACE (``model.to(dtype)``); pass
    ``dtype=None`` to run it as loaded. Returns float32 vectors of length d_in; a fused ``[E, ., .]`` expert
    parameter gets ``[E, d_in]``: row e from the tokens the router sent to expert e (docs/anatomy.md, "FRAG").
    """
    chosen = frag_weights(model, target)
    return _collect(model, tokenizer, texts, chosen, max_length=max_length, dtype=dtype)


def _routed(args: tuple[Any, ...], kwargs: dict[str, Any], who: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states [T, H], expert indices [T, k]) of a fused experts module's call."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    hidden = next((t for t in tensors if t.is_floating_point()), None)
    index = next((t for t in tensors if not t.is_floating_point() and t.dtype != torch.bool), None)
    if hidden is None or index is None:
        raise ValueError(f"experts module {who!r}: expected (hidden_states, expert indices, ...) as inputs")
    hidden = hidden.reshape(-1, hidden.shape[-1])
    return hidden, index.reshape(hidden.shape[0], -1)


def _expert_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    out = x @ weight if transposed else x @ weight.t()
    return out + bias if bias is not None else out


def _expert_mid(module: torch.nn.Module, x: torch.Tensor, e: int, transposed: bool) -> torch.Tensor:
    """The input of expert ``e``'s down projection for its routed tokens ``x``, computed as the module does."""
    params = dict(module.named_parameters(recurse=False))

    def proj(name: str) -> torch.Tensor:
        bias = params.get(f"{name}_bias")
        return _expert_linear(x, params[name][e], bias[e] if bias is not None else None, transposed)

    if "gate_up_proj" in params:
        h = proj("gate_up_proj")
        apply_gate = getattr(module, "_apply_gate", None)
        if callable(apply_gate):  # transformers' gating of this experts class (concatenated or interleaved)
            return apply_gate(h)
        gate, up = h.chunk(2, dim=-1)
        return module.act_fn(gate) * up
    if "gate_proj" in params:
        return module.act_fn(proj("gate_proj")) * proj("up_proj")
    return module.act_fn(proj("up_proj"))


def _collect(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    chosen: Sequence[Weight],
    *,
    max_length: int,
    dtype: torch.dtype | None,
) -> dict[str, torch.Tensor]:
    texts = list(texts)
    if not texts:
        raise ValueError("collect_input_norms: no calibration texts given")
    if max_length < 1:
        raise ValueError(f"collect_input_norms: max_length must be >= 1, got {max_length}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"collect_input_norms: calibration text #{i} is {type(text).__name__}, not str")
    if dtype is not None and _model_dtype(model) != dtype:
        model.to(dtype)
    device = model_device(model)
    modules = dict(model.named_modules())

    totals: dict[str, torch.Tensor] = {}  # sum over sequences of per-sequence norms (float64)
    current: dict[str, torch.Tensor] = {}  # per-sequence sum of squares over tokens (float64)
    linear: dict[str, Weight] = {}  # module -> its scored weight
    experts: dict[str, list[Weight]] = {}  # fused experts module -> its scored 3-D parameters
    for w in chosen:
        d_in = int(w.input_dim or 0)
        if w.hook == "experts":
            experts.setdefault(w.module, []).append(w)
            totals[w.name] = torch.zeros(w.shape[0], d_in, dtype=torch.float64)
        else:
            linear[w.module] = w
            totals[w.name] = torch.zeros(d_in, dtype=torch.float64)

    def add(name: str, sq: torch.Tensor) -> None:
        current[name] = current[name] + sq if name in current else sq

    def linear_hook(w: Weight):
        d_in = int(w.input_dim or 0)

        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            x = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
            if x.shape[-1] != d_in:
                raise ValueError(f"module {w.module!r}: input has {x.shape[-1]} channels, weight expects {d_in}")
            add(w.name, x.pow(2).sum(dim=0, dtype=torch.float64).cpu())

        return hook

    def experts_hook(module_name: str, weights: list[Weight]):
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden, index = _routed(args, kwargs, module_name)
            hidden = hidden.detach()
            for w in weights:
                sq = torch.zeros(w.shape[0], int(w.input_dim or 0), dtype=torch.float64)
                for e in range(w.shape[0]):
                    rows = (index == e).any(dim=-1).nonzero().squeeze(-1)
                    if rows.numel() == 0:
                        continue
                    x = hidden[rows]
                    if w.role in ("down", "fc_out"):
                        x = _expert_mid(module, x, e, w.transposed)
                    if x.shape[-1] != sq.shape[1]:
                        raise ValueError(
                            f"experts {w.name!r}: expert {e} input has {x.shape[-1]} channels, weight expects "
                            f"{sq.shape[1]}"
                        )
                    sq[e] = x.to(torch.float32).pow(2).sum(dim=0, dtype=torch.float64).cpu()
                add(w.name, sq)

        return hook

    handles = [modules[m].register_forward_pre_hook(linear_hook(w), with_kwargs=True) for m, w in linear.items()] + [
        modules[m].register_forward_pre_hook(experts_hook(m, ws), with_kwargs=True) for m, ws in experts.items()
    ]
    try:
        with torch.no_grad(), eval_mode(model):
            for i, text in enumerate(progress(texts, desc="activation norms", leave=False)):
                enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
                if enc["input_ids"].numel() == 0:
                    raise ValueError(f"collect_input_norms: calibration text #{i} tokenizes to zero tokens: {text!r}")
                current.clear()
                model(**{k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")})
                for name, sq in current.items():
                    totals[name] += sq.sqrt()
    finally:
        for h in handles:
            h.remove()
        current.clear()
    n = len(texts)
    return {name: (total / n).to(torch.float32) for name, total in totals.items()}
