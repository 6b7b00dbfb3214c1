"""How far apart two models' representations are, layer by layer: PCA similarity, PCA shift and linear CKA
(docs/definitions.md#representation-diagnostics).

Pure numpy on ``[N, d]`` feature matrices (one row per text), so the formulas are tested against brute force
without a model; :mod:`lacuna_metrics.diagnose.diagnostics` feeds them the features of :mod:`lacuna_metrics.diagnose.probes`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["Array", "linear_cka", "mean_pca_distance", "pca_shift", "pca_similarity"]

Array = np.ndarray
#: Variance below this fraction of the data scale (max |x| * sqrt(size)) is round-off: the direction is undefined.
_REL_TOL = 1e-10


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

    ``shifts`` holds :func:`pca_shift` per hidden state as ``output_hidden_states`` returns them: index 0 is the
    embedding output, 1 … L the L transformer layers. The paper's mean PCA distance averages over the L transformer
    layers, ``(1/L) Σ_{l=1..L} sqrt(dPC1_l^2 + (PC2upd_l - PC2ref_l)^2)``, so the default leaves index 0 out (averaging
    it in, as before, gave (L / (L + 1)) x the paper's value when the embeddings do not move: 0.8x at L = 4).
    ``use_pc2=False`` uses ``|dPC1_l|`` only. ``layers`` selects other indices (0 allowed). NaN if a selected layer's
    shift is NaN (degenerate PCA).
    """
    shifts = list(shifts)
    if not shifts:
        raise ValueError("mean_pca_distance: no layers given")
    if layers is None and len(shifts) < 2:
        raise ValueError("mean_pca_distance: no transformer layer (index 0 is the embedding output)")
    chosen = list(range(1, len(shifts))) if layers is None else list(layers)
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
