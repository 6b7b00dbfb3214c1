"""OpenUnlearning's metric robustness (Eq. 2-4) against a brute-force transcription, with the undefined cases."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lacuna_metrics import harmonic_mean, mean_interval, quantization_robustness, relearning_robustness


def _r_reference(ub: float, ua: float, rb: float, ra: float) -> float:
    """Eq. 2 as written, min(Δref / Δunl, 1), with the documented choices: Δunl <= 0 -> 1; clipped at 0."""
    if ua - ub <= 0:
        return 1.0
    return min(1.0, max(0.0, (ra - rb) / (ua - ub)))


@pytest.mark.parametrize("values", list(itertools.product([0.0, 0.2, 0.5, 1.0], repeat=4)))
def test_relearning_robustness_matches_the_equation_on_a_grid_with_ties(values):
    assert relearning_robustness(*values) == pytest.approx(_r_reference(*values))


def test_relearning_robustness_reads_as_intended():
    # the unlearned model's leak rises 0 -> 1 under relearning, the never-learned reference 0 -> 0.2: R = 0.2
    assert relearning_robustness(0.0, 1.0, 0.0, 0.2) == pytest.approx(0.2)
    # it rises no more than the reference: capped at 1
    assert relearning_robustness(0.0, 0.2, 0.0, 0.5) == 1.0
    # nothing resurfaced: 1, whatever the reference did
    assert relearning_robustness(0.3, 0.3, 0.0, 1.0) == 1.0
    assert relearning_robustness(None, 1.0, 0.0, 0.0) is None
    assert relearning_robustness(0.0, math.nan, 0.0, 0.0) is None


@pytest.mark.parametrize("before,after", list(itertools.product([0.0, 0.1, 0.5, 1.0], repeat=2)))
def test_quantization_robustness_matches_the_equation(before, after):
    expected = 1.0 if after == 0 else min(1.0, before / after)
    assert quantization_robustness(before, after) == pytest.approx(expected)


def test_harmonic_mean_against_scipy():
    from scipy.stats import hmean

    for a, b in [(0.5, 1.0), (0.2, 0.3), (1.0, 1.0)]:
        assert harmonic_mean(a, b) == pytest.approx(hmean([a, b]))
    assert harmonic_mean(0.0, 1.0) == 0.0 and harmonic_mean(None, 1.0) is None


def test_mean_interval_counts_and_covers():
    got = mean_interval([0.1, None, 0.3, math.inf, 0.5])
    assert got["n"] == 3 and got["dropped"] == 2 and got["mean"] == pytest.approx(0.3)
    assert got["low"] <= 0.3 <= got["high"]
    assert mean_interval([0.4])["low"] is None and mean_interval([])["mean"] is None
    # coverage of the bootstrap mean at n = 20 (normal data): at least 0.9 of 200 simulated pools
    rng = np.random.default_rng(1)
    hits = 0
    for i in range(200):
        sample = rng.normal(0.5, 0.2, 20)
        ci = mean_interval(list(sample), draws=400, seed=i)
        hits += ci["low"] <= 0.5 <= ci["high"]
    assert hits / 200 >= 0.9
