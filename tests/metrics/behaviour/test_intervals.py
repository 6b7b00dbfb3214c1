"""Per-person values and bootstrap intervals (lacuna_metrics.behaviour.intervals) against hand computations and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lacuna_metrics.behaviour.intervals import bootstrap_interval, per_person_values


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


def test_degenerate_inputs():
    assert bootstrap_interval([]) is None
    assert bootstrap_interval([0.4]) == [0.4, 0.4]
    assert bootstrap_interval({"a": 1.0, "b": 1.0}) == [1.0, 1.0]
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_interval([0.0, float("nan")])
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([0.0, 1.0], level=1.0)


def test_two_persons_match_the_exact_bootstrap_distribution():
    # Resampling [0, 1] twice: mean 0 (p=1/4), 0.5 (1/2), 1 (1/4); the 2.5% / 97.5% percentiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0], resamples=4000) == [0.0, 1.0]


def test_agrees_with_scipy_percentile_bootstrap_and_is_deterministic():
    values = np.random.default_rng(3).binomial(1, 0.3, size=40).astype(float)
    ours = bootstrap_interval(values, resamples=20000, seed=1)
    ref = stats.bootstrap((values,), np.mean, method="percentile", n_resamples=20000, random_state=1)
    assert ours[0] == pytest.approx(ref.confidence_interval.low, abs=0.03)
    assert ours[1] == pytest.approx(ref.confidence_interval.high, abs=0.03)
    assert ours[0] <= values.mean() <= ours[1]
    assert bootstrap_interval(values, seed=5) == bootstrap_interval(values, seed=5)
