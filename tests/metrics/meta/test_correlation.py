"""Spearman's ρ over a pool of models (lacuna_metrics/meta/correlation.py) against scipy and the textbook formula,
its degenerate cases, the underpowered flag, leave-one-method-out, and the coverage of its intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from lacuna_metrics.meta.correlation import MIN_MODELS, leave_one_out, spearman


@pytest.mark.parametrize("seed", range(5))
def test_rho_matches_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, 15).astype(float)  # many ties
    y = x + rng.integers(0, 3, 15)
    assert spearman(x, y)["rho"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)


def test_rho_without_ties_is_the_textbook_formula():
    x = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0]
    y = [2.0, 7.0, 1.0, 8.0, 2.5, 8.5, 3.0, 0.5]
    n = len(x)
    rx = {v: i + 1 for i, v in enumerate(sorted(x))}
    ry = {v: i + 1 for i, v in enumerate(sorted(y))}
    d2 = sum((rx[a] - ry[b]) ** 2 for a, b in zip(x, y, strict=True))
    assert spearman(x, y)["rho"] == pytest.approx(1 - 6 * d2 / (n * (n * n - 1)), abs=1e-12)


def test_degenerate_pools():
    out = spearman([1.0] * 10, list(range(10)))
    assert out["rho"] is None and out["low"] is None and "constant" in out["reason"] and out["n"] == 10
    out = spearman([1.0, 2.0, None, float("nan")], [1.0, 2.0, 3.0, 4.0])
    assert out["n"] == 2 and out["dropped"] == 2 and out["underpowered"]
    assert spearman([], [])["rho"] is None
    perfect = spearman(list(range(10)), list(range(10)), method="fisher")
    assert perfect["rho"] == 1.0 and perfect["low"] == perfect["high"] == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        spearman([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="interval method"):
        spearman([1.0, 2.0], [1.0, 2.0], method="percentile")


def test_underpowered_below_min_models_or_one_method():
    x = list(range(MIN_MODELS))
    assert not spearman(x, x, groups=["a", "b"] * (MIN_MODELS // 2))["underpowered"]
    small = spearman(x[:-1], x[:-1], groups=["a", "b"] * (MIN_MODELS // 2 - 1) + ["a"])
    assert small["underpowered"] and f"< {MIN_MODELS}" in small["reason"]
    one = spearman(x, x, groups=["a"] * MIN_MODELS)
    assert one["underpowered"] and one["reason"] == "one method only" and one["rho"] == 1.0


def test_leave_one_out_is_the_rho_of_the_rest():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=12), rng.normal(size=12)
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    out = leave_one_out(x, y, groups)
    assert sorted(out) == ["a", "b", "c"]
    keep = [i for i, g in enumerate(groups) if g != "b"]
    assert out["b"]["rho"] == pytest.approx(spearmanr(x[keep], y[keep]).statistic, abs=1e-12)
    assert out["b"]["n"] == 8


@pytest.mark.parametrize("method", ["bootstrap", "fisher"])
def test_interval_covers_on_simulated_pools(method):
    """A pool of 12 models with population Spearman ρ 0.5 (bivariate normal, r = 2 sin(π ρ / 6)): the 95% interval
    covers ρ at least 90% of the time over 300 pools (the wider grid is in the module docstring)."""
    rng = np.random.default_rng(7)
    rho_s = 0.5
    r = 2 * math.sin(math.pi * rho_s / 6)
    hits = 0
    for k in range(300):
        z = rng.multivariate_normal([0, 0], [[1, r], [r, 1]], 12)
        out = spearman(z[:, 0], z[:, 1], method=method, draws=300, seed=k)
        hits += out["low"] is not None and out["low"] <= rho_s <= out["high"]
    assert hits / 300 >= 0.90, hits / 300


def test_the_coverage_check_can_fail():
    """The same simulation with a 50% interval covers far less than 90%: the check above is not vacuous."""
    rng = np.random.default_rng(7)
    r = 2 * math.sin(math.pi * 0.5 / 6)
    hits = 0
    for _ in range(300):
        z = rng.multivariate_normal([0, 0], [[1, r], [r, 1]], 12)
        out = spearman(z[:, 0], z[:, 1], method="fisher", level=0.5)
        hits += out["low"] <= 0.5 <= out["high"]
    assert hits / 300 < 0.8
