"""The memorization token plan and extraction strength, by hand. The task pack through the real ``lm_eval`` CLI and
Python API: tests/e2e/test_lm_eval_tasks_cli.py.
"""

from __future__ import annotations

import math

import pytest

from lacuna_tasks.harness.hooks import TokenPlan, memorization_scores


def test_token_plan_per_token_by_hand():
    from lacuna_tasks.harness.hooks import GREEDY_TOKEN_GEN_KWARGS, TokenSlot

    plan = TokenPlan(
        requests=[
            ("loglikelihood", ("c", " ")),
            ("generate_until", ("c ", GREEDY_TOKEN_GEN_KWARGS)),
            ("loglikelihood", ("c ", "5")),  # lm-eval scores " 5": the space token, then "5"
            ("loglikelihood", ("c 5", "5")),
            ("loglikelihood", ("c 55", "<eos>")),
        ],
        slots=[TokenSlot(0), TokenSlot(2, covers=2, generation=1, expected="5"), TokenSlot(3)],
        eos_request=4,
        mismatch=False,
    )
    lls, greedy = plan.per_token([(-0.1, True), "7", (-0.5, True), (-0.2, False), (-0.3, True)])
    assert lls == pytest.approx([-0.1, -0.4, -0.2, -0.3])
    assert greedy == [True, True, False]  # the space is greedy: the request's own flag is the token's
    # the space is not greedy: the request's all-greedy flag says nothing, the greedy generation decides
    _, greedy = plan.per_token([(-0.1, False), "5", (-0.5, False), (-0.2, True), (-0.3, True)])
    assert greedy == [False, True, True]
    _, greedy = plan.per_token([(-0.1, False), "7", (-0.5, False), (-0.2, True), (-0.3, True)])
    assert greedy == [False, False, True]
    # no generation request: the flag is unobservable -> None, counted as not greedy and flagged
    plan.slots[1].generation = None
    lls, greedy = plan.per_token([(-0.1, False), "5", (-0.5, False), (-0.2, True), (-0.3, True)])
    assert greedy == [False, None, True]
    scores = memorization_scores(lls, greedy, m=3)
    assert scores["token_mismatch"] == 1.0 and scores["em"] == pytest.approx(1 / 3)
    assert scores["prob"] == pytest.approx(math.exp((-0.1 - 0.4 - 0.2 - 0.3) / 4))


@pytest.mark.parametrize(
    ("greedy", "expected_es"),
    [
        ([True, True, True, True], 1.0),
        ([False, True, True, True], 0.75),
        ([True, False, True, True], 0.5),
        ([True, True, True, False], 0.25),  # no greedy suffix: k* = m-1, the 1/m floor
        ([False, False, False, False], 0.25),
    ],
)
def test_extraction_strength_hand_computed(greedy, expected_es):
    scores = memorization_scores([math.log(0.5)] * 5, greedy, m=4)
    assert scores["es"] == pytest.approx(expected_es)
    assert scores["em"] == pytest.approx(sum(greedy) / 4)
    assert scores["prob"] == pytest.approx(0.5)
