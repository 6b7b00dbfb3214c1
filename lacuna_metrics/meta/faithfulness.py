"""Faithfulness of a behaviour metric (docs/meta.md, "Faithfulness"), as OpenUnlearning's meta-evaluation defines
it: does the metric separate models that know the forget facts from models that never learned them? The AUC of the
metric over the two pools (Mann-Whitney, ties counted one half), oriented so that 1 means "the models that know
score higher", with a stratified bootstrap interval over models and both pool sizes. Its coverage, simulated with
the metric shifted by one sd between the pools (300 simulations each): 0.90 at 5 + 5 models, 0.94 at 10 + 10, 0.95 at
20 + 20 (``tests/metrics/meta/test_faithfulness.py``), hence the underpowered flag under 5 models a pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MIN_PER_POOL", "faithfulness_auc"]

#: Fewer models than this in either pool and the AUC is marked underpowered.
MIN_PER_POOL = 5


def _auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(pos > neg) + 0.5 P(pos = neg), over every pair."""
    greater = (pos[:, None] > neg[None, :]).sum()
    equal = (pos[:, None] == neg[None, :]).sum()
    return float(greater + 0.5 * equal) / (len(pos) * len(neg))


def faithfulness_auc(
    knows: Sequence[float],
    never_learned: Sequence[float],
    *,
    higher_means_knows: bool = True,
    level: float = 0.95,
    draws: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """AUC of a metric separating ``knows`` (its values on models that hold the facts) from ``never_learned``;
    ``higher_means_knows`` False for a metric that falls when a model knows (a loss, a perplexity)."""
    pos = np.array([float(v) for v in knows if v is not None and math.isfinite(float(v))])
    neg = np.array([float(v) for v in never_learned if v is not None and math.isfinite(float(v))])
    if not higher_means_knows:
        pos, neg = -pos, -neg
    out: dict[str, Any] = {"n_knows": len(pos), "n_never_learned": len(neg), "level": level, "interval": "bootstrap"}
    if len(pos) == 0 or len(neg) == 0:
        return {**out, "auc": None, "low": None, "high": None, "underpowered": True, "reason": "an empty pool"}
    auc = _auc(pos, neg)
    rng = np.random.default_rng(seed)
    values = [_auc(rng.choice(pos, len(pos)), rng.choice(neg, len(neg))) for _ in range(draws)]
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    small = min(len(pos), len(neg)) < MIN_PER_POOL
    return {
        **out,
        "auc": auc,
        "low": float(low),
        "high": float(high),
        "underpowered": small,
        "reason": f"fewer than {MIN_PER_POOL} models in a pool" if small else None,
    }
