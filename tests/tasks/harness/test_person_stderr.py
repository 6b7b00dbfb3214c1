"""lm-eval's stderr of the per-person aggregates (J_P, J_ICR, J_W, Success@N) is taken over persons, not documents:
by hand, and lm-eval's stderr function is the per-person one. Through the real ``lm_eval`` CLI:
tests/e2e/test_person_stderr_cli.py.
"""

from __future__ import annotations

import math

import pytest

from lacuna_tasks.harness.hooks import install_person_stderr, per_person_any, per_person_stderr


def _sd_over_sqrt_n(values: list[float]) -> float:
    n = len(values)
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def test_per_person_stderr_by_hand():
    items = [("a", True), ("a", False), ("a", None), ("b", False), ("b", False), ("c", False), ("c", True)]
    # persons a=1, b=0, c=1 -> mean 2/3, sample sd sqrt(1/3), stderr sqrt(1/3)/sqrt(3) = 1/3
    assert per_person_any(items) == pytest.approx(2 / 3)
    assert per_person_stderr(items) == pytest.approx(1 / 3)
    # over the 6 observed documents it would be something else
    docs = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert _sd_over_sqrt_n(docs) != pytest.approx(1 / 3)
    assert per_person_stderr([("a", True), ("a", False)]) == "N/A"  # one person: no spread to measure
    assert per_person_stderr([("a", None), ("b", None)]) == "N/A"
    assert per_person_stderr([("a", True), ("b", True), ("c", True)]) == 0.0


def test_lm_eval_stderr_function_is_the_per_person_one():
    from lm_eval import evaluator_utils
    from lm_eval.api.metrics import mean, mean_stderr

    assert install_person_stderr() is True  # idempotent: already installed at import
    assert evaluator_utils.stderr_for_metric(per_person_any, 1000) is per_person_stderr
    assert evaluator_utils.stderr_for_metric(per_person_any, 0) is None  # --bootstrap_iters 0: no stderr
    assert evaluator_utils.stderr_for_metric(mean, 1000) is mean_stderr  # lm-eval's own metrics untouched
    assert install_person_stderr() is True
    assert not hasattr(evaluator_utils.stderr_for_metric.__wrapped__, "__wrapped__")  # wrapped once only
