"""The noise controls' check: does a predictor rank a method-free update as robust forgetting? (docs/meta.md)

A method-free update (a weight-decay step or Gaussian noise of a method's size, which knows nothing of the forget
facts) forgets nothing that relearning could bring back, so a predictor of lasting forgetting must not place it
among the models it predicts to be most robust. For a predictor x and an outcome y where higher y is worse (more
leak after relearning), the predicted robustness of a model is x oriented by the sign of ρ(x, y) over the
non-control models: with ρ > 0, low x predicts robust. A noise control is "ranked robust" when its predicted
robustness lies in the top ``top`` fraction of the pool (ties share the mean rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TOP_FRACTION", "noise_ranking"]

#: The share of the pool predicted most robust where a noise control must not appear.
TOP_FRACTION = 0.25


def noise_ranking(
    x: Sequence[float | None], rho: float | None, is_noise: Sequence[bool], *, top: float = TOP_FRACTION
) -> dict[str, Any]:
    """Where the noise controls fall in the ranking a predictor implies (module docstring): each control's
    percentile of predicted robustness (1 = predicted most robust) and whether any lies in the top ``top``.
    ``rho``: the predictor's ρ with the outcome over the non-control models; None or 0 gives no ranking."""
    if not 0 < top < 1:
        raise ValueError(f"top must be in (0, 1), got {top!r}")
    if len(x) != len(is_noise):
        raise ValueError(f"noise_ranking: x and is_noise differ in length: {len(x)}, {len(is_noise)}")
    keep = [i for i, v in enumerate(x) if v is not None and math.isfinite(float(v))]
    controls = [i for i in keep if is_noise[i]]
    base: dict[str, Any] = {"controls": len(controls), "top": top}
    if not controls:
        return {**base, "ranked_robust": None, "percentiles": [], "reason": "no noise control with a value"}
    if rho is None or rho == 0 or len(keep) < 2:
        return {**base, "ranked_robust": None, "percentiles": [], "reason": "no direction: ρ undefined or 0"}
    values = np.array([float(x[i]) for i in keep])
    robust = -values if rho > 0 else values  # higher = predicted more robust
    order = robust.argsort(kind="stable")
    ranks = np.empty(len(keep))
    ranks[order] = np.arange(1, len(keep) + 1)
    for v in np.unique(robust):  # ties share the mean rank
        tie = robust == v
        ranks[tie] = ranks[tie].mean()
    pct = {i: float((ranks[k] - 1) / (len(keep) - 1)) for k, i in enumerate(keep)}
    percentiles = [pct[i] for i in controls]
    return {
        **base,
        "ranked_robust": any(p >= 1 - top for p in percentiles),
        "percentiles": percentiles,
        "reason": None,
    }
