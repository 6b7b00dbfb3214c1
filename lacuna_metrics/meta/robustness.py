"""Robustness of a metric itself, as OpenUnlearning's meta-evaluation defines it (docs/meta.md, "Robustness").

A metric m (oriented so that higher = more knowledge) is robust when it does not move under interventions that
should not change what a model knows about the forget facts, or moves no more than for a model that never knew
them:

* relearning (OpenUnlearning Eq. 2): R = min((m_ref^a − m_ref^b) / (m_unl^a − m_unl^b), 1), where ``unl`` is an
  unlearned model, ``ref`` a model that never learned the facts, both relearned on the same budget (``b`` before,
  ``a`` after). The metric's rise on the unlearned model is compared with what the budget teaches from scratch;
* quantization (Eq. 3): Q = min(m_unl^b / m_unl^a, 1), before (``b``) and after (``a``) quantizing the weights;
* both (Eq. 4): the harmonic mean of R and Q.

The ratios are undefined where a denominator is 0; the choices (documented, recorded in the output) are: under
relearning, an unlearned model whose metric does not rise (m_unl^a − m_unl^b <= 0) gives R = 1 (nothing resurfaced);
under quantization, m_unl^a = 0 gives Q = 1 (nothing to reveal). Negative ratios (the reference falls while the
unlearned model rises) are clipped to 0, so R, Q ∈ [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["UNDEFINED_RULES", "harmonic_mean", "mean_interval", "quantization_robustness", "relearning_robustness"]

#: The choices where OpenUnlearning's ratios divide by zero (recorded beside every result).
UNDEFINED_RULES = {
    "relearning": "R = 1 when the unlearned model's metric does not rise under relearning; ratios clipped to [0, 1]",
    "quantization": "Q = 1 when the quantized model's metric is 0; ratios clipped to [0, 1]",
}


def _finite(*values: float | None) -> bool:
    return all(v is not None and math.isfinite(float(v)) for v in values)


def relearning_robustness(
    unl_before: float | None, unl_after: float | None, ref_before: float | None, ref_after: float | None
) -> float | None:
    """OpenUnlearning's R of one unlearned model (module docstring); None when an input is missing."""
    if not _finite(unl_before, unl_after, ref_before, ref_after):
        return None
    rise = float(unl_after) - float(unl_before)  # type: ignore[arg-type]
    if rise <= 0:
        return 1.0
    return float(min(max((float(ref_after) - float(ref_before)) / rise, 0.0), 1.0))  # type: ignore[arg-type]


def quantization_robustness(before: float | None, after: float | None) -> float | None:
    """OpenUnlearning's Q of one model (module docstring); None when an input is missing."""
    if not _finite(before, after):
        return None
    if float(after) == 0.0:  # type: ignore[arg-type]
        return 1.0
    return float(min(max(float(before) / float(after), 0.0), 1.0))  # type: ignore[arg-type]


def harmonic_mean(a: float | None, b: float | None) -> float | None:
    """HM(a, b) = 2ab / (a + b); 0 when either is 0; None when either is missing."""
    if not _finite(a, b):
        return None
    a, b = float(a), float(b)  # type: ignore[arg-type]
    return 0.0 if a + b == 0 or a == 0 or b == 0 else 2 * a * b / (a + b)


def mean_interval(
    values: Sequence[float | None], *, level: float = 0.95, draws: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Mean of the per-model values (missing ones dropped and counted) with a percentile bootstrap interval over
    models; ``n`` beside it. One model: no interval."""
    data = np.array([float(v) for v in values if _finite(v)])
    out: dict[str, Any] = {"n": int(data.size), "dropped": len(values) - int(data.size), "level": level}
    if data.size == 0:
        return {**out, "mean": None, "low": None, "high": None}
    if data.size == 1:
        return {**out, "mean": float(data[0]), "low": None, "high": None}
    rng = np.random.default_rng(seed)
    means = rng.choice(data, size=(draws, data.size)).mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {**out, "mean": float(data.mean()), "low": float(low), "high": float(high)}
