"""The faithfulness AUC (lacuna_metrics/meta/faithfulness.py) against sklearn with ties, its orientation and
degenerate pools, and the coverage of its interval."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from lacuna_metrics.meta.faithfulness import MIN_PER_POOL, faithfulness_auc


@pytest.mark.parametrize("seed", range(4))
def test_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    pos, neg = rng.integers(0, 5, 9).astype(float), rng.integers(0, 4, 7).astype(float)
    expect = roc_auc_score([1] * 9 + [0] * 7, np.concatenate([pos, neg]))
    assert faithfulness_auc(pos, neg)["auc"] == pytest.approx(expect, abs=1e-12)
    lower = faithfulness_auc(-pos, -neg, higher_means_knows=False)
    assert lower["auc"] == pytest.approx(expect, abs=1e-12)


def test_degenerate_pools():
    assert faithfulness_auc([], [1.0])["auc"] is None
    same = faithfulness_auc([1.0] * 6, [1.0] * 6)
    assert same["auc"] == 0.5 and same["low"] == same["high"] == 0.5
    small = faithfulness_auc([1.0, 2.0], [0.0, float("nan"), None])
    assert small["n_never_learned"] == 1 and small["underpowered"] and small["auc"] == 1.0
    assert not faithfulness_auc([1.0] * MIN_PER_POOL, [0.0] * MIN_PER_POOL)["underpowered"]


def test_interval_covers_on_simulated_pools():
    """Pools of 10 and 10 models, the metric shifted by one sd (true AUC = Φ(1/√2)): the 95% interval covers it at
    least 90% of the time over 300 simulations; a 50% interval does not (the check can fail)."""
    rng = np.random.default_rng(11)
    truth = float(norm.cdf(1 / np.sqrt(2)))
    hits = {0.95: 0, 0.5: 0}
    for k in range(300):
        pos, neg = rng.normal(1.0, 1.0, 10), rng.normal(0.0, 1.0, 10)
        for level in hits:
            out = faithfulness_auc(pos, neg, level=level, draws=400, seed=k)
            hits[level] += out["low"] <= truth <= out["high"]
    assert hits[0.95] / 300 >= 0.90, hits
    assert hits[0.5] / 300 < 0.8, hits
