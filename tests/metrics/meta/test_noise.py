"""The noise controls' check: a predictor that ranks a method-free update among the most robust is caught, one
that ranks it last is not, and a control barely inside or outside the top share flips the verdict."""

from __future__ import annotations

import pytest

from lacuna_metrics import noise_ranking


def test_a_predictor_ranking_the_control_most_robust_is_caught():
    # rho > 0: low x predicts robust (low leak after relearning); the control has the lowest x
    got = noise_ranking([0.0, 1.0, 2.0, 3.0, 4.0], 0.8, [True, False, False, False, False])
    assert got["ranked_robust"] is True and got["percentiles"] == [1.0]
    # the same values with rho < 0: high x predicts robust, the control is last
    got = noise_ranking([0.0, 1.0, 2.0, 3.0, 4.0], -0.8, [True, False, False, False, False])
    assert got["ranked_robust"] is False and got["percentiles"] == [0.0]


def test_the_top_share_boundary_against_a_brute_force_percentile():
    x = list(range(9))  # rho < 0: percentile of value v is v / 8
    for control in range(9):
        flags = [i == control for i in range(9)]
        got = noise_ranking(x, -1.0, flags, top=0.25)
        assert got["percentiles"] == [pytest.approx(control / 8)]
        assert got["ranked_robust"] is (control / 8 >= 0.75)


def test_ties_share_the_mean_rank_and_missing_values_are_skipped():
    got = noise_ranking([1.0, 1.0, 1.0, None, 0.0], -1.0, [True, False, False, True, False])
    assert got["controls"] == 1 and got["percentiles"] == [pytest.approx(2 / 3)]  # ranks 2, 3, 4 tie: mean 3 of 4


def test_no_direction_or_no_control_gives_no_verdict():
    assert noise_ranking([1.0, 2.0], None, [True, False])["ranked_robust"] is None
    assert noise_ranking([1.0, 2.0], 0.0, [True, False])["ranked_robust"] is None
    assert noise_ranking([1.0, 2.0], 0.5, [False, False])["ranked_robust"] is None
    with pytest.raises(ValueError, match="top"):
        noise_ranking([1.0], 0.5, [True], top=1.0)
