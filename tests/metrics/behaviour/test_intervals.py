"""Per-person values and exact intervals over persons (lacuna_metrics.behaviour.intervals): against scipy's
binomtest, a brute-force inversion of the binomial tails, hand cases, degenerate inputs, and coverage simulated
and computed exactly (issue 35 item 3)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from lacuna_metrics.behaviour.intervals import clopper_pearson, per_person_values, rate_interval


def _sample(person: str, **metrics):
    return {"doc": {"person": person}, **metrics}


def test_pairs_are_a_union_per_person_and_none_is_not_observed():
    samples = [
        _sample("a", j_w=["a", False]),
        _sample("a", j_w=["a", True]),
        _sample("b", j_w=["b", False]),
        _sample("c", j_w=["c", None]),  # c's probes are not part of this metric
    ]
    assert per_person_values(samples, "j_w") == {"a": 1.0, "b": 0.0}


def test_numbers_are_averaged_per_person_and_match_the_aggregate_for_equal_counts():
    samples = [_sample(p, j_avg=float(h)) for p, h in [("a", 1), ("a", 0), ("b", 1), ("b", 1), ("c", 0), ("c", 0)]]
    values = per_person_values(samples, "j_avg")
    assert values == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert np.mean(list(values.values())) == pytest.approx(np.mean([s["j_avg"] for s in samples]))


def test_missing_metric_and_mixed_shapes():
    assert per_person_values([_sample("a", accuracy=1.0)], "leak_rate") == {}
    with pytest.raises(ValueError, match="mixes"):
        per_person_values([_sample("a", x=["a", True]), _sample("b", x=1.0)], "x")


# --- the exact binomial interval against independent references -------------------------------------------------


@pytest.mark.parametrize("level", [0.95, 0.9, 0.99])
def test_clopper_pearson_matches_scipy_binomtest_exact(level):
    for n in [*range(1, 31), 50, 100]:
        for k in range(n + 1):
            ref = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
            low, high = clopper_pearson(k, n, level=level)
            assert low == pytest.approx(ref.low, abs=1e-10), (k, n)
            assert high == pytest.approx(ref.high, abs=1e-10), (k, n)


def _tail_le(k: int, n: int, p: float) -> float:
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def _bisect(f, lo: float = 0.0, hi: float = 1.0) -> float:
    """The root of ``f`` on [lo, hi] for ``f(lo) > 0 > f(hi)`` or the reverse, to 1e-13."""
    sign = f(lo) > 0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == sign:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _brute_force(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The Clopper-Pearson definition, inverted by bisection on binomial sums (no Beta function): low is the p at
    which P(X >= k) = alpha/2, high the p at which P(X <= k) = alpha/2."""
    low = 0.0 if k == 0 else _bisect(lambda p: (1 - _tail_le(k - 1, n, p)) - alpha / 2)
    high = 1.0 if k == n else _bisect(lambda p: _tail_le(k, n, p) - alpha / 2)
    return low, high


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 2), (1, 2), (0, 5), (5, 5), (2, 7), (3, 10), (0, 20), (17, 40)])
def test_clopper_pearson_matches_the_brute_force_inversion(k, n):
    assert clopper_pearson(k, n) == pytest.approx(_brute_force(k, n), abs=1e-9)


def test_hand_cases():
    # k = 0: high solves (1 - p)^n = 0.025; k = n: low solves p^n = 0.025; n = 1 gives [0, 0.975] and [0.025, 1]
    assert clopper_pearson(0, 5) == pytest.approx((0.0, 1 - 0.025 ** (1 / 5)))
    assert clopper_pearson(0, 5)[1] == pytest.approx(0.5218, abs=1e-4)  # the 0/5 cell: [0, 0.52], not [0, 0]
    assert clopper_pearson(5, 5) == pytest.approx((0.025 ** (1 / 5), 1.0))
    assert clopper_pearson(0, 1) == pytest.approx((0.0, 0.975))
    assert clopper_pearson(1, 1) == pytest.approx((0.025, 1.0))
    assert clopper_pearson(0, 2) == pytest.approx((0.0, 1 - math.sqrt(0.025)))


# --- the record written to results.json ---------------------------------------------------------------------------


def test_rate_interval_records_k_n_level_and_method():
    got = rate_interval({"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 1.0}, metric="forget_leak")
    low, high = clopper_pearson(2, 5)
    assert got == {"low": low, "high": high, "k": 2, "n": 5, "level": 0.95, "method": "clopper_pearson"}
    assert isinstance(got["k"], int)
    assert json.loads(json.dumps(got)) == got
    assert rate_interval([0.0] * 5, metric="j_w") == {
        "low": 0.0, "high": pytest.approx(0.5218, abs=1e-4), "k": 0, "n": 5, "level": 0.95, "method": "clopper_pearson"
    }  # fmt: skip
    assert rate_interval([1.0, 0.0], metric="x", level=0.9)["level"] == 0.9


def test_shares_of_several_questions_use_the_fractional_count():
    got = rate_interval([1 / 3, 2 / 3, 1.0, 0.0], metric="crossfield_accuracy")
    assert got["method"] == "clopper_pearson_fractional"
    assert got["k"] == pytest.approx(2.0) and got["n"] == 4
    assert (got["low"], got["high"]) == pytest.approx(clopper_pearson(2, 4))  # a whole sum: the binomial interval
    between = rate_interval([0.5, 0.0, 0.0, 0.0], metric="es")  # k = 0.5 lies between 0 of 4 and 1 of 4
    assert clopper_pearson(0, 4)[1] < between["high"] < clopper_pearson(1, 4)[1]
    assert 0.0 < between["low"] < clopper_pearson(1, 4)[0]
    assert between["low"] <= 0.125 <= between["high"]


def test_degenerate_inputs():
    assert rate_interval([], metric="forget_leak") is None  # n = 0: no interval
    assert rate_interval({}, metric="forget_leak") is None
    with pytest.raises(ValueError, match=r"j_w: person 'p2' has value nan"):
        rate_interval({"p1": 0.0, "p2": float("nan")}, metric="j_w")
    with pytest.raises(ValueError, match="forget_leak.*inf"):
        rate_interval([0.0, float("inf")], metric="forget_leak")
    with pytest.raises(ValueError, match=r"retain_accuracy: .*1\.5.*outside \[0, 1\]"):
        rate_interval([1.5], metric="retain_accuracy")
    with pytest.raises(ValueError, match="em: .*non-numeric"):
        rate_interval([None], metric="em")
    with pytest.raises(ValueError, match="n >= 1"):
        clopper_pearson(0, 0)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(6, 5)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson(float("nan"), 5)
    with pytest.raises(ValueError, match="level"):
        clopper_pearson(1, 5, level=1.0)
    # float rounding just past 1 is a 1, not an error
    assert rate_interval([1.0 + 1e-12, 1.0], metric="x")["k"] == 2


# --- coverage -----------------------------------------------------------------------------------------------------

NS = (2, 5, 20, 100)
PS = (0.0, 0.05, 0.3, 0.5)


@pytest.mark.parametrize("n", NS)
def test_binomial_interval_covers_at_least_95_percent_simulated(n):
    """Seeded simulation over persons: each draw is n persons leaking with probability p, the interval is the one
    results.json records for them. 20,000 draws per cell: the Monte Carlo error (sd <= 0.0016) is small against the
    margin of the closest cell (n = 20, p = 0.5, exact coverage 0.9586)."""
    rng = np.random.default_rng(35)
    by_k = {k: rate_interval([1.0] * k + [0.0] * (n - k), metric="sim") for k in range(n + 1)}  # depends on k only
    low = np.array([by_k[k]["low"] for k in range(n + 1)])
    high = np.array([by_k[k]["high"] for k in range(n + 1)])
    for p in PS:
        k = (rng.random((20_000, n)) < p).sum(axis=1)
        coverage = np.mean((low[k] <= p) & (p <= high[k]))
        assert coverage >= 0.95, (n, p, coverage)


def test_binomial_interval_covers_at_least_95_percent_exactly():
    """The same guarantee without Monte Carlo error, on a fine grid: coverage = sum of the binomial pmf over the k
    whose interval holds p."""
    for n in (*range(1, 41), 100):
        ks = np.arange(n + 1)
        bounds = np.array([clopper_pearson(int(k), n) for k in ks])
        for p in np.linspace(0.0, 1.0, 201):
            coverage = stats.binom.pmf(ks, n, p)[(bounds[:, 0] <= p) & (p <= bounds[:, 1])].sum()
            assert coverage >= 0.95 - 1e-12, (n, p, coverage)


def _shares(rng, n: int, mu: float, draws: int, kind: str) -> np.ndarray:
    """Per-person values of mean ``mu`` that are not all 0/1: a person's share of 3 questions (persons differ:
    their chance is Beta of mean mu), or a continuous score in [0, 1] (Beta of mean mu)."""
    if mu == 0.0:
        return np.zeros((draws, n))
    q = rng.beta(mu * 2, (1 - mu) * 2, size=(draws, n))
    if kind == "share_of_3":
        return rng.binomial(3, q) / 3
    return q


@pytest.mark.parametrize("kind", ["share_of_3", "continuous"])
@pytest.mark.parametrize("n", NS)
def test_fractional_interval_covers_at_least_95_percent_simulated(kind, n):
    """The interval for means of per-person values in [0, 1] that are not all 0/1 (cross-field retention, J_avg,
    ES, Prob): 2,000 seeded draws per cell."""
    rng = np.random.default_rng(350 + n)
    for mu in PS:
        values = _shares(rng, n, mu, 2000, kind)
        hits = 0
        for row in values:
            got = rate_interval(row.tolist(), metric="sim")
            hits += got["low"] <= mu <= got["high"]
        assert hits / len(values) >= 0.95, (kind, n, mu, hits / len(values))


@pytest.mark.parametrize("n", NS)
def test_fractional_interval_covers_nearly_binary_values_exactly(n):
    """Values 0.01 or 0.99 (the closest a non-0/1 value comes to the binomial the interval is built for): coverage
    by the exact pmf of how many persons take 0.99."""
    ks = np.arange(n + 1)
    records = [rate_interval([0.99] * int(k) + [0.01] * (n - int(k)), metric="sim") for k in ks]
    assert {r["method"] for r in records} == {"clopper_pearson_fractional"}
    low, high = np.array([r["low"] for r in records]), np.array([r["high"] for r in records])
    for mu in np.linspace(0.01, 0.99, 99):
        q = (mu - 0.01) / 0.98
        coverage = stats.binom.pmf(ks, n, q)[(low <= mu) & (mu <= high)].sum()
        assert coverage >= 0.95, (n, mu, coverage)
