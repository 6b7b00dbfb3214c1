"""The relearning attack's controls (issue 35 item 2): a positive control must really suppress and come back beyond
learning from scratch; a method is reversible only where its relearned leak exceeds the negative control's beyond
their interval. Hand-built results entries; the whole protocol runs in tests/e2e/test_run_benchmark.py."""

from __future__ import annotations

import copy

from lacuna_unlearn.bench.reversibility import apply_controls, judge_positive_control


def _rev(leak: float, n: int = 5, *, reversible: bool = True) -> dict:
    regime = {"regime": "reversible_noncatastrophic" if reversible else "irreversible_noncatastrophic",
              "reversible": reversible, "source": "forget", "forget_gap": 1 - leak}  # fmt: skip
    return {"sources": {"forget": {"forget_leak": leak, "n": {"forget_leak": n}}}, "regime": regime}


def _entry(unlearned_leak: float, relearned_leak: float, *, reversible: bool = True) -> dict:
    rev = _rev(relearned_leak, reversible=reversible)
    return {"behaviour": {"forget_leak": unlearned_leak}, "reversibility": rev, "regime": dict(rev["regime"])}


BASELINE = {"behaviour": {"forget_leak": 1.0}}
SCRATCH = {"relearned": {"forget_leak": 0.0, "n": 5}}  # the budget teaches nobody from scratch
EVERYTHING = {"relearned": {"forget_leak": 1.0, "n": 5}}  # ... or everybody


def test_a_positive_control_must_suppress_come_back_and_beat_learning_from_scratch():
    passed = judge_positive_control(_entry(0.0, 1.0), [], BASELINE, SCRATCH)
    assert passed["attack_strong_enough"] and passed["silenced"] == 1.0
    weak_silence = judge_positive_control(_entry(0.4, 1.0), [], BASELINE, SCRATCH)  # silenced 60% < 80%
    assert not weak_silence["attack_strong_enough"] and "silenced 60%" in weak_silence["reason"]
    barely = judge_positive_control(_entry(0.2, 1.0), [], BASELINE, SCRATCH)  # exactly 80%: passes
    assert barely["attack_strong_enough"]
    no_return = judge_positive_control(_entry(0.0, 0.2, reversible=False), [], BASELINE, SCRATCH)
    assert not no_return["attack_strong_enough"] and "did not restore" in no_return["reason"]
    taught = judge_positive_control(_entry(0.0, 1.0), [], BASELINE, EVERYTHING)  # scratch learning explains it
    assert not taught["attack_strong_enough"] and "learning from scratch" in taught["reason"]


def test_a_failed_positive_control_leaves_no_regime_label():
    failed = judge_positive_control(_entry(0.4, 1.0), [], BASELINE, SCRATCH)
    method = _entry(0.0, 0.0, reversible=False)
    apply_controls(method, failed, SCRATCH)
    assert method["regime"]["regime"] == "undetermined" and method["regime"]["reversible"] is None
    assert "too weak" in method["regime"]["reason"] and method["regime"]["controls"]["positive_passed"] is False


def test_reversible_only_beyond_learning_from_scratch():
    passed = judge_positive_control(_entry(0.0, 1.0), [], BASELINE, SCRATCH)
    back = _entry(0.0, 1.0)
    apply_controls(back, passed, SCRATCH)
    assert back["regime"]["regime"] == "reversible_noncatastrophic"  # 5/5 back against 0/5 from scratch
    assert back["regime"]["controls"]["separation_from_negative"]["separated"]
    partly = _entry(0.0, 0.4)  # 2/5 back: within what the interval allows learning from scratch to explain
    apply_controls(partly, passed, SCRATCH)
    assert partly["regime"]["regime"] == "undetermined" and "learning afresh" in partly["regime"]["reason"]
    gone = _entry(0.0, 0.0, reversible=False)  # irreversible needs no separation
    before = copy.deepcopy(gone["regime"])
    apply_controls(gone, passed, SCRATCH)
    assert {k: v for k, v in gone["regime"].items() if k != "controls"} == before
    untouched = {"regime": {"regime": "x"}}  # no reversibility result: nothing to judge
    apply_controls(untouched, passed, SCRATCH)
    assert untouched == {"regime": {"regime": "x"}}
