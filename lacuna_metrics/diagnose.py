"""Representation diagnostics: did unlearning move the features, or only the read-out?
(docs/definitions.md#representation-diagnostics)

"Unlearning Isn't Deletion" compares a reference (original) model with an updated (unlearned or relearned) model on
the same query texts: per layer, the agreement of the first principal directions (PCA similarity), the shift
of the updated centroid in the reference PCA plane (PCA shift, summarised by the mean PCA distance),
linear CKA, and the diagonal empirical Fisher. High PCA-sim / CKA and a small PCA distance mean the
features survived, which is the paper's supporting evidence that forgetting is reversible.

Differences from the authors' toolkit (each switchable or documented where it matters):

* pooling: the toolkit averages over ALL positions, padding included (``pooling="mean"``, padded to
  ``max_length``), so short texts are pulled towards the pad-token representation. The default here is
  ``"masked_mean"`` (attention-mask-weighted mean). All four metrics use one pooling; the toolkit uses plain mean
  for PCA and the first token for CKA (``pooling="first"``).
* layers: ``output_hidden_states`` indices 0 (embedding output) … L for every metric. The toolkit's CKA layer
  ``model.layers.{l}`` is our layer l+1 (for the last layer HF applies the final norm to the returned state).
* PCA similarity is ``|cos|`` by default: the sign of a principal component is arbitrary.
* Fisher: pad labels are ``-100`` by default (the toolkit trains on pad tokens: ``labels="toolkit"``), and the layer
  of a parameter is found by exact module prefix (the toolkit's substring test puts ``model.layers.10`` into
  layer 1).

Definitions: ``docs/definitions.md#representation-diagnostics``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lacuna_metrics.activations import eval_mode, model_device
from lacuna_metrics.manifest import save_figure

__all__ = [
    "FISHER_LABELS",
    "POOLINGS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "diagnose",
    "empirical_fisher",
    "fisher_diagonal",
    "hidden_features",
    "linear_cka",
    "mean_pca_distance",
    "pca_shift",
    "pca_similarity",
    "write_diagnose_plots",
]

SCHEMA = "lacuna-bench/diagnose"
SCHEMA_VERSION = 1
POOLINGS: tuple[str, ...] = ("masked_mean", "mean", "first", "last")
FISHER_LABELS: tuple[str, ...] = ("masked", "toolkit")
#: Quantiles of log10 F reported per layer.
FISHER_QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
#: Extra text tokenized by both tokenizers when checking that they agree.
_PROBE_TEXT = "Q: What is the email address of Jane Doe-Smith?\nA: jane.doe42@example.org, phone +1 (555) 010-9999\n"

Array = np.ndarray
#: Variance below this fraction of the data scale (max |x| * sqrt(size)) is round-off: the direction is undefined.
_REL_TOL = 1e-10


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


# -- PCA ----------------------------------------------------------------------------------------------------


def _as_matrix(x: Any, name: str) -> Array:
    arr = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D [N, d] matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds non-finite values")
    return arr


def _pair(x: Any, y: Any, who: str) -> tuple[Array, Array]:
    a, b = _as_matrix(x, f"{who}: first matrix"), _as_matrix(y, f"{who}: second matrix")
    if a.shape != b.shape:
        raise ValueError(f"{who}: shapes differ ({a.shape} vs {b.shape}); features must be of the same texts")
    return a, b


def _principal_axes(x: Array, k: int) -> Array | None:
    """The first ``k`` principal directions (rows, unit norm) of ``x``, or None when fewer than ``k`` exist.

    PCA = SVD of the column-centred matrix (what sklearn's PCA does). Sign convention: each direction is flipped so
    that its largest-magnitude entry is positive (sklearn >= 1.5, ``u_based_decision=False``). A direction "exists"
    when its singular value is above round-off (:data:`_REL_TOL` of the data scale): with N < k+1 texts or constant
    features there is no variance to define it, and the caller reports NaN.
    """
    n, d = x.shape
    if n < 2:
        return None
    xc = x - x.mean(axis=0, keepdims=True)
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    scale = float(np.abs(x).max()) * math.sqrt(n * d)
    if len(s) < k or scale == 0.0 or s[k - 1] <= _REL_TOL * scale:
        return None
    axes = vt[:k].copy()
    idx = np.argmax(np.abs(axes), axis=1)
    signs = np.sign(axes[np.arange(k), idx])
    return axes * signs[:, None]


def pca_similarity(h_ref: Any, h_upd: Any, absolute: bool = True) -> float:
    """Cosine between the first principal directions of the reference and updated features
    (docs/definitions.md#representation-diagnostics).

    PCA is fitted separately on each ``[N, d]`` matrix. ``absolute=True`` (default) returns ``|cos|`` in [0, 1]
    because a PC's sign is arbitrary; ``absolute=False`` gives the toolkit's signed value under the sign convention of
    :func:`_principal_axes`. NaN when a PC1 is undefined: fewer than 2 texts, or features constant over the texts.
    """
    a, b = _pair(h_ref, h_upd, "pca_similarity")
    ca, cb = _principal_axes(a, 1), _principal_axes(b, 1)
    if ca is None or cb is None:
        return float("nan")
    cos = float(np.clip(ca[0] @ cb[0], -1.0, 1.0))  # unit vectors
    return abs(cos) if absolute else cos


def pca_shift(h_ref: Any, h_upd: Any) -> tuple[float, float, float]:
    """``(delta_pc1, pc2_ref, pc2_upd)`` in the reference model's PC1-PC2 plane
    (docs/definitions.md#representation-diagnostics).

    PCA (2 components) is fitted on ``h_ref`` only; both feature matrices are projected WITHOUT centring (as the
    toolkit does) and averaged over texts: ``delta_pc1 = mean(H_upd c1) - mean(H_ref c1)``,
    ``pc2_x = mean(H_x c2)``. Identical features give ``delta_pc1 = 0`` and ``pc2_ref = pc2_upd`` exactly. The sign
    of c1/c2 follows :func:`_principal_axes`. NaN for PC1 terms when the reference has no variance (N < 2 or
    constant features); NaN for PC2 terms when it has only one direction of variance (e.g. N = 2).
    """
    a, b = _pair(h_ref, h_upd, "pca_shift")
    nan = float("nan")
    c1 = _principal_axes(a, 1)
    if c1 is None:
        return nan, nan, nan
    delta = float(np.mean(b @ c1[0]) - np.mean(a @ c1[0]))
    c2 = _principal_axes(a, 2)
    if c2 is None:
        return delta, nan, nan
    return delta, float(np.mean(a @ c2[1])), float(np.mean(b @ c2[1]))


def mean_pca_distance(
    shifts: Sequence[tuple[float, float, float]],
    use_pc2: bool = True,
    layers: Sequence[int] | None = None,
) -> float:
    """Layer-averaged distance between reference and updated centroids in the reference PC plane
    (docs/definitions.md#representation-diagnostics).

    INFERRED definition (the paper's formula was not found): ``mean_l sqrt(dPC1_l^2 + (PC2upd_l - PC2ref_l)^2)``;
    ``use_pc2=False`` uses ``|dPC1_l|`` only. ``shifts`` holds :func:`pca_shift` per layer (index = layer);
    ``layers`` selects layer indices (default all). NaN if a selected layer's shift is NaN (degenerate PCA).
    """
    shifts = list(shifts)
    if not shifts:
        raise ValueError("mean_pca_distance: no layers given")
    chosen = list(range(len(shifts))) if layers is None else list(layers)
    if not chosen:
        raise ValueError("mean_pca_distance: empty layer selection")
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not 0 <= layer < len(shifts):
            raise ValueError(f"mean_pca_distance: layer {layer!r} out of range 0..{len(shifts) - 1}")
    dists = []
    for layer in chosen:
        delta, pc2_ref, pc2_upd = (float(v) for v in shifts[layer])
        dists.append(math.hypot(delta, pc2_upd - pc2_ref) if use_pc2 else abs(delta))
    return float(np.mean(dists))


# -- CKA ----------------------------------------------------------------------------------------------------


def _centred(x: Array) -> tuple[Array, float | None]:
    """Column-centred ``x`` and its Frobenius norm; None when there is no variance above round-off."""
    xc = x - x.mean(axis=0, keepdims=True)
    norm = float(np.linalg.norm(xc))
    scale = float(np.abs(x).max()) if x.size else 0.0
    if x.shape[0] < 2 or scale == 0.0 or norm <= _REL_TOL * scale * math.sqrt(x.size):
        return xc, None
    return xc, norm


def linear_cka(x: Any, y: Any) -> float:
    """Linear CKA between two ``[n, d]`` representations of the same n inputs
    (docs/definitions.md#representation-diagnostics), in [0, 1].

    Frobenius form ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F + 1e-12)`` in float64, which equals the toolkit's
    ``tr(HKH HLH) / (sqrt(tr(HKH HKH) tr(HLH HLH)) + 1e-12)``. For stability each centred matrix is first scaled
    to unit Frobenius norm (CKA is scale-invariant), so the 1e-12 cannot dominate for small-magnitude activations
    and the squares cannot overflow for large ones; the n x n Gram form is used when n < d (cheaper, same value).
    Degenerate inputs: NaN when either side has no variance (n < 2 or constant features); CKA is undefined there
    (the toolkit would report 0).
    """
    a, b = _pair(x, y, "linear_cka")
    a, na = _centred(a)
    b, nb = _centred(b)
    if na is None or nb is None:
        return float("nan")
    a, b = a / na, b / nb
    if a.shape[0] < a.shape[1]:
        ka, kb = a @ a.T, b @ b.T
        num = float(np.sum(ka * kb))
        den = float(np.linalg.norm(ka) * np.linalg.norm(kb))
    else:
        num = float(np.linalg.norm(b.T @ a) ** 2)
        den = float(np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b))
    return float(np.clip(num / (den + 1e-12), 0.0, 1.0))


# -- Fisher -------------------------------------------------------------------------------------------------


def _layer_prefixes(model: torch.nn.Module) -> list[str]:
    """``"<path>.<i>."`` of each transformer block, as :func:`lacuna_metrics.anatomy.find_blocks` finds them (the
    ModuleList of ``config.num_hidden_layers`` blocks; docs/anatomy.md)."""
    from lacuna_metrics.anatomy import find_blocks

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


# -- end to end ---------------------------------------------------------------------------------------------


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def _load_config(path: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def _load_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    return model.eval()


def _check_tokenizers(ref_path: Path, ref_tok: Any, upd_path: Path, upd_tok: Any, texts: list[str]) -> None:
    if ref_tok.get_vocab() != upd_tok.get_vocab():
        raise ValueError(
            f"tokenizers differ: the vocabularies of {ref_path} ({len(ref_tok)} tokens) and {upd_path} "
            f"({len(upd_tok)} tokens) are not the same; representations of different tokenizations are not comparable"
        )
    for text in [*texts[:8], _PROBE_TEXT]:
        if ref_tok(text)["input_ids"] != upd_tok(text)["input_ids"]:
            raise ValueError(f"tokenizers differ: {ref_path} and {upd_path} tokenize {text[:60]!r} differently")


def _check_configs(ref_path: Path, ref_cfg: Any, upd_path: Path, upd_cfg: Any) -> None:
    for key in ("model_type", "num_hidden_layers", "hidden_size"):
        a, b = getattr(ref_cfg, key, None), getattr(upd_cfg, key, None)
        if a != b:
            raise ValueError(f"architectures differ: {key} is {a!r} in {ref_path} but {b!r} in {upd_path}")


def _finite(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _texts_fingerprint(texts: list[str]) -> str:
    payload = json.dumps(texts, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def _compare(h_ref: list[Array], h_upd: list[Array], *, use_pc2: bool, layers: Sequence[int] | None) -> dict[str, Any]:
    if len(h_ref) != len(h_upd):
        raise ValueError(f"layer counts differ: {len(h_ref)} vs {len(h_upd)}")
    rows, shifts, notes = [], [], []
    for layer, (a, b) in enumerate(zip(h_ref, h_upd, strict=True)):
        shift = pca_shift(a, b)
        shifts.append(shift)
        row = {
            "layer": layer,
            "pca_sim": pca_similarity(a, b),
            "pca_sim_signed": pca_similarity(a, b, absolute=False),
            "delta_pc1": shift[0],
            "pc2_ref": shift[1],
            "pc2_upd": shift[2],
            "pca_distance": math.hypot(shift[0], shift[2] - shift[1]) if use_pc2 else abs(shift[0]),
            "cka": linear_cka(a, b),
        }
        bad = [k for k, v in row.items() if k != "layer" and not math.isfinite(v)]
        if bad:
            notes.append(f"layer {layer}: {', '.join(bad)} undefined (too few texts or constant features)")
        rows.append({k: (v if k == "layer" else _finite(v)) for k, v in row.items()})
    return {
        "per_layer": rows,
        "mean_pca_distance": _finite(mean_pca_distance(shifts, use_pc2=use_pc2, layers=layers)),
        "notes": notes,
    }


def diagnose(
    reference_dir: str | os.PathLike[str],
    updated_dirs: Sequence[str | os.PathLike[str]],
    texts: Sequence[str],
    *,
    pooling: str = "masked_mean",
    max_length: int = 128,
    batch_size: int = 16,
    fisher: bool = True,
    fisher_batch_size: int = 4,
    fisher_num_batches: int = 10,
    fisher_labels: str = "masked",
    use_pc2: bool = True,
    distance_layers: Sequence[int] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    plots: bool = False,
) -> dict[str, Any]:
    """Representation diagnostics of each updated model against the reference on ``texts``
    (docs/definitions.md#representation-diagnostics).

    Returns (and, with ``out_dir``, writes atomically to ``out_dir/diagnose.json``) a JSON-able dict, schema
    ``lacuna-bench/diagnose`` version 1: per updated model and layer ``pca_sim`` (|cos|), ``pca_sim_signed``,
    ``delta_pc1``, ``pc2_ref``, ``pc2_upd``, ``pca_distance``, ``cka``; ``mean_pca_distance`` (inferred,
    docs/definitions.md#representation-diagnostics); Fisher summaries of reference and updated
    (:func:`fisher_diagonal`); the options and a manifest. Undefined values (degenerate PCA/CKA) are ``null`` with a
    note. ``plots=True`` adds ``out_dir/plots/diagnose_layers.png`` and ``out_dir/plots/diagnose_pca_shift.png``. Models
    load from local files only, without remote code; the reference's features are computed first and the reference is
    freed, then the updated models are loaded one at a time. Tokenizers and configs (model_type, num_hidden_layers,
    hidden_size) of every updated model are checked against the reference before any weights are loaded (ValueError
    naming both paths).
    """
    started = time.time()
    who = "diagnose"
    texts = _check_texts(texts, who)
    if pooling not in POOLINGS:
        raise ValueError(f"{who}: unknown pooling {pooling!r}; expected one of {list(POOLINGS)}")
    if fisher_labels not in FISHER_LABELS:
        raise ValueError(f"{who}: unknown fisher_labels {fisher_labels!r}; expected one of {list(FISHER_LABELS)}")
    ref_path = Path(reference_dir)
    upd_paths = [Path(p) for p in updated_dirs]
    if not upd_paths:
        raise ValueError(f"{who}: no updated model given")
    for path in [ref_path, *upd_paths]:
        if not path.is_dir():
            raise FileNotFoundError(f"model directory not found: {path}")
    if plots and out_dir is None:
        raise ValueError(f"{who}: plots=True needs out_dir")

    ref_tok, ref_cfg = _load_tokenizer(ref_path), _load_config(ref_path)
    for path in upd_paths:  # fail fast, before any weights are loaded
        _check_configs(ref_path, ref_cfg, path, _load_config(path))
        _check_tokenizers(ref_path, ref_tok, path, _load_tokenizer(path), texts)

    n_states = getattr(ref_cfg, "num_hidden_layers", None)
    if distance_layers is not None and n_states is not None:  # fail before the forward passes, not after
        mean_pca_distance([(0.0, 0.0, 0.0)] * (n_states + 1), layers=distance_layers)

    feature_opts = {"pooling": pooling, "max_length": max_length, "batch_size": batch_size}
    fisher_opts = {
        "batch_size": fisher_batch_size,
        "num_batches": fisher_num_batches,
        "max_length": max_length,
        "labels": fisher_labels,
    }
    model = _load_model(ref_path)
    try:
        h_ref = hidden_features(model, ref_tok, texts, **feature_opts)
        ref_fisher = fisher_diagonal(model, ref_tok, texts, **fisher_opts) if fisher else None
    finally:
        del model
        gc.collect()

    updated = []
    for path in upd_paths:
        tok = _load_tokenizer(path)
        model = _load_model(path)
        try:
            h_upd = hidden_features(model, tok, texts, **feature_opts)
            upd_fisher = fisher_diagonal(model, tok, texts, **fisher_opts) if fisher else None
        finally:
            del model
            gc.collect()
        updated.append(
            {"path": str(path), **_compare(h_ref, h_upd, use_pc2=use_pc2, layers=distance_layers), "fisher": upd_fisher}
        )

    from lacuna_metrics.manifest import hardware, package_versions

    result: dict[str, Any] = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "reference": {"path": str(ref_path), "fisher": ref_fisher},
        "updated": updated,
        "layers": list(range(len(h_ref))),
        "options": {
            **feature_opts,
            "pca_similarity": "absolute cosine (pca_sim); signed in pca_sim_signed",
            "cka_features": f"pooled hidden states ({pooling}), layers 0..L",
            "mean_pca_distance": {
                "use_pc2": use_pc2,
                "layers": None if distance_layers is None else list(distance_layers),
                "definition": "inferred (docs/definitions.md#representation-diagnostics)",
            },
            "fisher": fisher_opts if fisher else None,
        },
        "manifest": {
            "num_texts": len(texts),
            "texts_fingerprint": _texts_fingerprint(texts),
            "versions": package_versions(),
            "hardware": hardware(),
            "wall_seconds": round(time.time() - started, 3),
        },
    }
    if out_dir is not None:  # the JSON and its plots appear together, or nothing does
        from lacuna_metrics.manifest import publish_together, write_json

        out = Path(out_dir)
        with publish_together(out) as staging:
            if plots:
                written = write_diagnose_plots(result, staging / "plots")
                result["manifest"]["plots"] = [str(out / p.relative_to(staging)) for p in written]
            write_json(staging / "diagnose.json", result)
    return result


# -- plots --------------------------------------------------------------------------------------------------


def write_diagnose_plots(result: dict[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """``diagnose_layers.png`` (PCA-sim and CKA vs layer, one line per updated model) and ``diagnose_pca_shift.png``
    (per layer: the reference centroid at (0, PC2_ref) and each updated model at (dPC1, PC2_upd))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    nan = float("nan")

    def val(v: Any) -> float:
        return nan if v is None else float(v)

    layers = result["layers"]
    labels = [Path(u["path"]).name or u["path"] for u in result["updated"]]
    if len(set(labels)) < len(labels):  # e.g. run1/model and run2/model
        labels = [u["path"] for u in result["updated"]]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "pca_sim", "PCA similarity |cos(PC1)|"), (axes[1], "cka", "linear CKA")):
        for label, upd in zip(labels, result["updated"], strict=True):
            ax.plot(layers, [val(r[key]) for r in upd["per_layer"]], marker="o", label=label)
        ax.set(title=title, xlabel="layer (0 = embeddings)", ylim=(-0.02, 1.02))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.tight_layout()
    written = [save_figure(fig, out / "diagnose_layers.png")]

    ncols = min(6, len(layers))
    nrows = math.ceil(len(layers) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3 * ncols, 2.8 * nrows), squeeze=False)
    for layer in layers:
        ax = axes[layer // ncols][layer % ncols]
        first = result["updated"][0]["per_layer"][layer]
        ax.scatter([0.0], [val(first["pc2_ref"])], marker="x", color="black", label="reference")
        for label, upd in zip(labels, result["updated"], strict=True):
            row = upd["per_layer"][layer]
            ax.scatter([val(row["delta_pc1"])], [val(row["pc2_upd"])], label=label)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel("ΔPC1", fontsize=8)
        ax.set_ylabel("PC2", fontsize=8)
    for k in range(len(layers), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    written.append(save_figure(fig, out / "diagnose_pca_shift.png"))
    return written
