"""What the diagnostics measure on a loaded model: pooled hidden states per layer and the diagonal empirical Fisher
(docs/definitions.md#representation-diagnostics).

Both run the model on the same query texts with the same tokenization (right padding, a pad token borrowed from
EOS when missing, the tokenizer restored afterwards), so they share it here; the comparison of two models lives in
:mod:`lacuna_metrics.diagnose.similarity` and the report in :mod:`lacuna_metrics.diagnose.diagnostics`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from lacuna_metrics.diagnose.similarity import Array
from lacuna_metrics.frag.activation_norms import eval_mode, model_device

__all__ = ["FISHER_LABELS", "FISHER_QUANTILES", "POOLINGS", "empirical_fisher", "fisher_diagonal", "hidden_features"]

POOLINGS: tuple[str, ...] = ("masked_mean", "mean", "first", "last")
FISHER_LABELS: tuple[str, ...] = ("masked", "toolkit")
#: Quantiles of log10 F reported per layer.
FISHER_QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


# -- helpers ------------------------------------------------------------------------------------------------


def _check_texts(texts: Sequence[str], who: str) -> list[str]:
    texts = list(texts)
    if not texts:
        raise ValueError(f"{who}: no query texts given")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"{who}: query text #{i} is {type(text).__name__}, not str")
    return texts


def _check_positive(name: str, value: int, who: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{who}: {name} must be an integer >= 1, got {value!r}")


@contextlib.contextmanager
def _right_padding(tokenizer: Any) -> Iterator[None]:
    """Pad on the right (position 0 is the first real token; positions ids stay 0..T-1) and make sure there is a
    pad token (EOS if the tokenizer has none); the tokenizer is restored afterwards."""
    side = getattr(tokenizer, "padding_side", "right")
    had_pad = tokenizer.pad_token is not None
    if not had_pad:
        if tokenizer.eos_token is None:
            raise ValueError("tokenizer has neither a pad token nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    try:
        yield
    finally:
        tokenizer.padding_side = side
        if not had_pad:
            tokenizer.pad_token = None


def _encode(tokenizer: Any, texts: list[str], max_length: int, pad_to_max: bool, device: torch.device):
    enc = tokenizer(
        texts,
        padding="max_length" if pad_to_max else True,
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    mask = enc.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(enc["input_ids"])
    empty = (mask.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"query text {texts[empty[0]]!r} tokenizes to zero tokens")
    return enc["input_ids"].to(device), mask.to(device)


# -- features -----------------------------------------------------------------------------------------------


def hidden_features(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    pooling: str = "masked_mean",
    max_length: int = 128,
    batch_size: int = 16,
) -> list[Array]:
    """One pooled vector per text and layer: a list over layers 0 (embeddings) … L of float64 ``[N, d]`` arrays.

    Poolings: ``masked_mean`` (default; mean over real tokens only), ``mean`` (the toolkit's plain mean over all
    ``max_length`` positions, padding included: inputs are padded to ``max_length``), ``first`` (position 0, the
    toolkit's CKA feature), ``last`` (last real token). Texts are right-padded (the tokenizer is restored after),
    so with a causal model every pooling except ``mean`` is independent of batching. Runs batched, in eval mode,
    without gradients; features are cast to float64 on the CPU.
    """
    who = "hidden_features"
    texts = _check_texts(texts, who)
    if pooling not in POOLINGS:
        raise ValueError(f"{who}: unknown pooling {pooling!r}; expected one of {list(POOLINGS)}")
    _check_positive("max_length", max_length, who)
    _check_positive("batch_size", batch_size, who)
    device = model_device(model)
    per_layer: list[list[Array]] = []
    with torch.no_grad(), eval_mode(model), _right_padding(tokenizer):
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            input_ids, mask = _encode(tokenizer, chunk, max_length, pooling == "mean", device)
            out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            states = out.hidden_states
            if not per_layer:
                per_layer = [[] for _ in states]
            m = mask.to(torch.float64).unsqueeze(-1)
            last = mask.sum(dim=1) - 1  # right padding: index of the last real token
            rows = torch.arange(input_ids.shape[0], device=device)
            for layer, h in enumerate(states):
                h = h.detach().to(torch.float64)
                if pooling == "masked_mean":
                    pooled = (h * m).sum(dim=1) / m.sum(dim=1)
                elif pooling == "mean":
                    pooled = h.mean(dim=1)
                elif pooling == "first":
                    pooled = h[:, 0, :]
                else:
                    pooled = h[rows, last, :]
                per_layer[layer].append(pooled.cpu().numpy())
            del out, states
    return [np.concatenate(chunks, axis=0) for chunks in per_layer]


# -- Fisher -------------------------------------------------------------------------------------------------


def _layer_prefixes(model: torch.nn.Module) -> list[str]:
    """``"<path>.<i>."`` of each transformer block, as :func:`lacuna_metrics.weights.anatomy.find_blocks` finds them (the
    ModuleList of ``config.num_hidden_layers`` blocks; docs/anatomy.md)."""
    from lacuna_metrics.weights.anatomy import find_blocks

    name, blocks = find_blocks(model)
    return [f"{name}.{i}." for i in range(len(blocks))]


def _fisher(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int,
    num_batches: int,
    max_length: int,
    labels: str,
) -> tuple[dict[str, torch.Tensor], int]:
    """F per parameter name and the number of batches used (see :func:`empirical_fisher`)."""
    who = "empirical_fisher"
    texts = _check_texts(texts, who)
    _check_positive("batch_size", batch_size, who)
    _check_positive("num_batches", num_batches, who)
    _check_positive("max_length", max_length, who)
    if labels not in FISHER_LABELS:
        raise ValueError(f"{who}: unknown labels mode {labels!r}; expected one of {list(FISHER_LABELS)}")
    device = model_device(model)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    acc = {n: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for n, p in trainable}
    used = 0
    with eval_mode(model), _right_padding(tokenizer), torch.enable_grad():
        for start in range(0, len(texts), batch_size):
            if used >= num_batches:
                break
            chunk = texts[start : start + batch_size]
            input_ids, mask = _encode(tokenizer, chunk, max_length, labels == "toolkit", device)
            target = input_ids.clone() if labels == "toolkit" else input_ids.masked_fill(mask == 0, -100)
            if not bool((target[:, 1:] != -100).any()):
                continue
            if trainable:
                loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
                grads = torch.autograd.grad(loss, [p for _, p in trainable], allow_unused=True)
                for (name, _), g in zip(trainable, grads, strict=True):
                    if g is not None:
                        acc[name].add_(g.detach().to(torch.float32).pow(2))
                del loss, grads
            used += 1
    if used == 0:
        raise ValueError(f"{who}: no batch has a target token (texts of one token each?)")
    out: dict[str, torch.Tensor] = {}
    for name, p in named:
        out[name] = acc.pop(name).div_(used).cpu() if name in acc else torch.zeros(p.shape, dtype=torch.float32)
    return out, used


def empirical_fisher(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 4,
    num_batches: int = 10,
    max_length: int = 128,
    labels: str = "masked",
) -> dict[str, torch.Tensor]:
    """Diagonal empirical Fisher ``F_i = (1/B) sum_b (d mean-loss_b / d theta_i)^2`` per parameter
    (docs/definitions.md#representation-diagnostics).

    Batches of ``batch_size`` consecutive texts, at most ``num_batches`` of them (the toolkit's 4 x 10). The loss is
    the HF causal-LM loss (mean over labelled tokens of the batch); ``labels="masked"`` (default) sets pad labels to
    -100, ``labels="toolkit"`` pads to ``max_length`` and uses ``labels = input_ids`` (pads included), as the
    toolkit does. Gradients come from ``torch.autograd.grad`` (``.grad`` of the model is untouched), in eval mode.
    Parameters with ``requires_grad=False`` get F = 0 exactly: they are not part of the update, so the loss has no
    gradient w.r.t. them here. Batches without any labelled target token are skipped. Returns float32 CPU tensors
    keyed by parameter name (shared parameters appear once).
    """
    values, _ = _fisher(
        model, tokenizer, texts, batch_size=batch_size, num_batches=num_batches, max_length=max_length, labels=labels
    )
    return values


def _summarize(values: list[torch.Tensor], n_frozen: int) -> dict[str, Any]:
    n = int(sum(v.numel() for v in values))
    if n == 0:
        return {"n_params": 0, "n_frozen": 0}
    flat = torch.cat([v.reshape(-1) for v in values]).to(torch.float64).numpy()
    positive = flat[flat > 0]
    summary: dict[str, Any] = {
        "n_params": n,
        "n_frozen": int(n_frozen),
        "zero_fraction": float(1.0 - positive.size / n),
        "mean": float(flat.mean()),
        "median": float(np.median(flat)),
        "max": float(flat.max()),
        "sum": float(flat.sum()),
    }
    if positive.size:
        logs = np.log10(positive)
        summary["log10_mean"] = float(logs.mean())
        summary["log10_quantiles"] = {
            f"{q:g}": float(v) for q, v in zip(FISHER_QUANTILES, np.quantile(logs, FISHER_QUANTILES), strict=True)
        }
    else:
        summary["log10_mean"] = None
        summary["log10_quantiles"] = None
    return summary


def fisher_diagonal(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 4,
    num_batches: int = 10,
    max_length: int = 128,
    labels: str = "masked",
) -> dict[str, Any]:
    """Per-transformer-block summaries of the diagonal empirical Fisher
    (docs/definitions.md#representation-diagnostics), JSON-able.

    F is computed by :func:`empirical_fisher`; each block's values are then summarised one block at a time and
    released: ``n_params``, ``n_frozen`` (requires_grad=False, F = 0 exactly), ``zero_fraction``, ``mean``,
    ``median``, ``max``, ``sum`` of F over all the block's parameters (frozen included), and ``log10_mean`` /
    ``log10_quantiles`` over the positive entries (log of 0 is undefined; None when there are none). A parameter
    belongs to block i when its name starts with the block's module path (exact prefix, not the toolkit's
    substring match). Parameters outside the blocks (embeddings, final norm, head) are summarised under ``other``.
    """
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    prefixes = _layer_prefixes(model)
    values, used = _fisher(
        model, tokenizer, texts, batch_size=batch_size, num_batches=num_batches, max_length=max_length, labels=labels
    )
    groups: list[list[str]] = [[] for _ in prefixes]
    other: list[str] = []
    for name in values:
        for i, prefix in enumerate(prefixes):
            if name.startswith(prefix):
                groups[i].append(name)
                break
        else:
            other.append(name)
    layers = []
    for i, names in enumerate(groups):
        summary = _summarize([values[n] for n in names], sum(values[n].numel() for n in names if n in frozen))
        layers.append({"layer": i, **summary})
        for n in names:
            del values[n]
    rest = _summarize([values[n] for n in other], sum(values[n].numel() for n in other if n in frozen))
    return {
        "labels": labels,
        "batch_size": batch_size,
        "num_batches": used,
        "max_length": max_length,
        "layers": layers,
        "other": rest,
    }
