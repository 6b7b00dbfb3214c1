"""Rank correlation between a predictor and an outcome over a pool of unlearned models, with an interval and its n
(docs/meta.md, "Correlation"): the statistic of FRAG's Table 3 (Spearman over checkpoints), with the checks a pool
of a few dozen models needs.

* **The interval.** A percentile bootstrap over models by default (what FRAG reports), or Fisher's z of ρ with the
  Bonett-Wright variance ``(1 + ρ²/2) / (n - 3)``. Their coverage, simulated on bivariate normal pools
  (``tests/metrics/meta/test_correlation.py``; 400 pools per cell, n 8 / 12 / 20 / 40, ρ 0 / 0.5 /
  0.8): bootstrap 0.935-0.988, Fisher 0.907-0.978 (0.907 at n = 8, ρ = 0.8).
* **Underpowered.** Under :data:`MIN_MODELS` models, or with one method only, ρ is still computed but marked
  ``underpowered`` with the reason; a ρ never appears without its n.
* **Leave one method out.** ρ recomputed without each method's models in turn (FRAG's circularity check): a
  predictor whose ρ rests on one method shows it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MIN_MODELS", "leave_one_out", "spearman", "spearman_interval"]

#: Fewer models than this and a correlation is reported as underpowered (with a Fisher interval, n - 3 >= 5).
MIN_MODELS = 8
INTERVALS = ("bootstrap", "fisher")


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), as Spearman's ρ uses them."""
    from scipy.stats import rankdata

    return rankdata(values, method="average")


def _rho(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson correlation of the average ranks; None when either side is constant (no ranking to compare)."""
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    if denominator == 0.0:
        return None
    return float((rx * ry).sum()) / denominator


def spearman_interval(
    x: np.ndarray,
    y: np.ndarray,
    rho: float,
    *,
    method: str = "bootstrap",
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A ``level`` interval for Spearman's ρ of ``(x, y)``; None where it is undefined (n <= 3 for Fisher)."""
    from scipy.stats import norm

    n = len(x)
    if method == "fisher":
        if n <= 3:
            return None
        if abs(rho) >= 1.0:
            return (rho, rho) if n > 3 else None
        z = math.atanh(rho)
        half = norm.ppf(0.5 + level / 2) * math.sqrt((1.0 + rho * rho / 2.0) / (n - 3))
        return (math.tanh(z - half), math.tanh(z + half))
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        values = []
        for _ in range(draws):
            pick = rng.integers(0, n, n)
            r = _rho(x[pick], y[pick])
            if r is not None:
                values.append(r)
        if not values:
            return None
        lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
        return (float(lo), float(hi))
    raise ValueError(f"interval method must be one of {INTERVALS}, got {method!r}")


def spearman(
    x: Sequence[float],
    y: Sequence[float],
    *,
    groups: Sequence[str] | None = None,
    method: str = "bootstrap",
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Spearman's ρ of ``x`` and ``y`` (pairs with a missing or non-finite side dropped) with its interval, n and
    whether it is underpowered (fewer than :data:`MIN_MODELS` pairs, or one ``groups`` value: one method only)."""
    if method not in INTERVALS:
        raise ValueError(f"interval method must be one of {INTERVALS}, got {method!r}")
    if len(x) != len(y) or (groups is not None and len(groups) != len(x)):
        raise ValueError(f"spearman: x, y (and groups) differ in length: {len(x)}, {len(y)}")
    keep = [
        i
        for i, (a, b) in enumerate(zip(x, y, strict=True))
        if a is not None and b is not None and math.isfinite(float(a)) and math.isfinite(float(b))
    ]
    xs = np.array([float(x[i]) for i in keep])
    ys = np.array([float(y[i]) for i in keep])
    kept_groups = sorted({groups[i] for i in keep}) if groups is not None else None
    n = len(keep)
    reasons = []
    if n < MIN_MODELS:
        reasons.append(f"{n} models (< {MIN_MODELS})")
    if kept_groups is not None and len(kept_groups) < 2:
        reasons.append("one method only")
    rho = _rho(xs, ys) if n >= 2 else None
    if rho is None and n >= 2:
        reasons.append("a constant side: no ranking")
    interval = (
        spearman_interval(xs, ys, rho, method=method, level=level, draws=draws, seed=seed) if rho is not None else None
    )
    return {
        "rho": rho,
        "low": interval[0] if interval else None,
        "high": interval[1] if interval else None,
        "n": n,
        "dropped": len(x) - n,
        "level": level,
        "interval": method,
        "underpowered": bool(reasons),
        "reason": "; ".join(reasons) or None,
    }


def leave_one_out(
    x: Sequence[float], y: Sequence[float], groups: Sequence[str], **kwargs: Any
) -> dict[str, dict[str, Any]]:
    """Spearman's ρ without each group's pairs in turn (group -> :func:`spearman` of the others)."""
    out = {}
    for left in sorted(set(groups)):
        keep = [i for i, g in enumerate(groups) if g != left]
        out[left] = spearman([x[i] for i in keep], [y[i] for i in keep], groups=[groups[i] for i in keep], **kwargs)
    return out
