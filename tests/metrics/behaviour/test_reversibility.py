"""Tests for the forgetting-regime classifier (docs/definitions.md#forgetting-regimes, inferred rule) and the lm-eval
results reader."""

from __future__ import annotations

import json
import math

import pytest

from lacuna_metrics.behaviour.regimes import (
    IDEAL_REGIME,
    NO_FORGETTING,
    REGIMES,
    UNDETERMINED,
    accuracies_from_lm_eval,
    classify_regime,
    recovery_ratio,
)


def test_recovery_ratio():
    assert recovery_ratio(0.9, 0.1, 0.5) == pytest.approx(0.5)
    assert recovery_ratio(0.9, 0.1, 0.9) == pytest.approx(1.0)
    assert recovery_ratio(0.9, 0.1, 0.1) == 0.0
    assert recovery_ratio(0.5, 0.1, 0.9) == pytest.approx(2.0)  # not clipped
    assert recovery_ratio(1, 0, 0.0) == 0.0  # ints accepted
    assert math.isnan(recovery_ratio(0.5, 0.5, 0.9))  # nothing removed
    assert math.isnan(recovery_ratio(0.4, 0.6, 0.9))  # unlearning raised forget accuracy
    assert math.isnan(recovery_ratio(0.5, 0.45, 0.5, eps=0.1))


HELD_OUT = {"retain_eval_accuracy": (1.0, 0.9), "crossfield_accuracy": (1.0, 1.0)}
BROKEN = {"retain_eval_accuracy": (1.0, 0.0), "crossfield_accuracy": (1.0, 1.0)}


@pytest.mark.parametrize(
    ("forget", "retained", "ppl", "regime"),
    [
        ((0.9, 0.0, 0.8), HELD_OUT, 1.1, "reversible_noncatastrophic"),  # gap 0.1
        ((0.9, 0.0, 0.8), BROKEN, 1.1, "reversible_catastrophic"),  # held-out retain gone
        ((0.9, 0.0, 0.1), HELD_OUT, 50.0, "irreversible_catastrophic"),  # gap 0.8, perplexity x50
        ((0.9, 0.0, 0.1), HELD_OUT, 1.1, "irreversible_noncatastrophic"),  # gap 0.8
    ],
)
def test_four_regimes(forget, retained, ppl, regime):
    out = classify_regime(*forget, retained=retained, ppl_ratio=ppl)
    assert out["regime"] == regime and regime in REGIMES
    assert out["ideal"] == (regime == IDEAL_REGIME == "irreversible_noncatastrophic")
    assert out["reversible"] == regime.startswith("reversible")
    assert out["catastrophic"] == regime.endswith("_catastrophic")
    assert out["forget_gap"] == pytest.approx(forget[0] - forget[2])  # Δr(T_f), absolute
    assert out["recovery_ratio"] == pytest.approx((forget[2] - forget[1]) / (forget[0] - forget[1]))
    assert out["thresholds"] == {"rule": "absolute", "tau_rev": 0.5, "tau_cat": 0.2, "tau_ppl": 2.0,
                                 "relative": False, "eps": 1e-9}  # fmt: skip
    json.dumps(out, allow_nan=False)


def test_the_catastrophic_axis_never_reads_trained_retain_rows():
    """grad_diff kept its retain QA at 1.0 (the rows its retain loss trains on) while held-out retain fell to 0 and
    the neutral perplexity grew 2.9e24 times: the earlier rule called it non-catastrophic."""
    destroyed = classify_regime(1.0, 0.0, 0.0, retained={"retain_eval_accuracy": (1.0, 0.0)}, ppl_ratio=2.9e24)
    assert destroyed["regime"] == "irreversible_catastrophic" and not destroyed["ideal"]
    inputs = destroyed["catastrophic_inputs"]
    assert inputs["retain_eval_accuracy"]["catastrophic"] and inputs["neutral_ppl_ratio"]["catastrophic"]
    assert inputs["crossfield_accuracy"] == {"measured": False}
    with pytest.raises(ValueError, match="catastrophic inputs"):
        classify_regime(1.0, 0.0, 0.0, retained={"retain_accuracy": (1.0, 1.0)})
    blind = classify_regime(1.0, 0.0, 0.0)  # nothing measured on that axis: no regime, with the reason
    assert blind["regime"] == UNDETERMINED and blind["catastrophic"] is None and "nothing measured" in blind["reason"]


def test_absolute_and_relative_reversibility():
    """Removing 1 of 5 facts and keeping it removed was "irreversible" (ideal) under the recovery ratio; the paper's
    gap Δr = 0.2 says the facts are as good as back."""
    partial = dict(retained=HELD_OUT, ppl_ratio=1.0)
    assert classify_regime(1.0, 0.8, 0.8, **partial)["regime"] == "reversible_noncatastrophic"
    relative = classify_regime(1.0, 0.8, 0.8, rule="relative", **partial)
    assert relative["regime"] == "irreversible_noncatastrophic" and relative["thresholds"]["rule"] == "relative"
    # boundaries: a gap equal to tau_rev is irreversible; rho equal to tau_rev is reversible (relative)
    assert classify_regime(1.0, 0.0, 0.5, **partial)["reversible"] is False
    assert classify_regime(1.0, 0.0, 0.5, rule="relative", **partial)["reversible"] is True
    with pytest.raises(ValueError, match="rule"):
        classify_regime(1.0, 0.0, 0.5, rule="paper")


def test_thresholds_and_relative_drop():
    # a drop equal to tau_cat is not catastrophic; a perplexity ratio equal to tau_ppl is not either
    at = classify_regime(1.0, 0.0, 0.0, retained={"retain_eval_accuracy": (0.5, 0.25)}, tau_cat=0.25, ppl_ratio=2.0)
    assert at["catastrophic"] is False
    # relative: 0.4 -> 0.25 is an absolute drop of 0.15 but a relative drop of 37.5%
    drop = {"retain_eval_accuracy": (0.4, 0.25)}
    assert classify_regime(0.8, 0.0, 0.0, retained=drop)["catastrophic"] is False
    rel = classify_regime(0.8, 0.0, 0.0, retained=drop, relative=True)
    assert rel["catastrophic"] is True
    assert rel["catastrophic_inputs"]["retain_eval_accuracy"]["drop"] == pytest.approx(0.375)
    zero = classify_regime(0.8, 0.0, 0.0, retained={"retain_eval_accuracy": (0.0, 0.0)}, relative=True)
    assert zero["catastrophic_inputs"]["retain_eval_accuracy"]["drop"] == 0.0
    assert classify_regime(0.8, 0.0, 0.2, retained=HELD_OUT, tau_ppl=5.0, ppl_ratio=4.0)["catastrophic"] is False


def test_no_forgetting():
    out = classify_regime(0.3, 0.3, 0.9, retained=BROKEN)
    assert out["regime"] == NO_FORGETTING == "no_forgetting"
    assert out["reversible"] is None and out["recovery_ratio"] is None and out["ideal"] is False
    assert out["catastrophic"] is True
    json.dumps(out, allow_nan=False)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"a_orig_f": 1.2}, "a_orig_f"),
        ({"a_unl_f": -0.1}, "a_unl_f"),
        ({"a_rel_f": float("nan")}, "a_rel_f"),
        ({"retained": {"retain_eval_accuracy": ("0.5", 0.4)}}, "retain_eval_accuracy"),
        ({"retained": {"crossfield_accuracy": (1.0, True)}}, "crossfield_accuracy"),
        ({"ppl_ratio": -1.0}, "neutral_ppl_ratio"),
        ({"tau_rev": float("inf")}, "tau_rev"),
        ({"tau_cat": None}, "tau_cat"),
        ({"tau_ppl": "2"}, "tau_ppl"),
    ],
)
def test_invalid_inputs(kwargs, name):
    args = {"a_orig_f": 0.9, "a_unl_f": 0.1, "a_rel_f": 0.5, "retained": HELD_OUT, **kwargs}
    with pytest.raises(ValueError, match=name):
        classify_regime(**args)


def test_accuracies_from_lm_eval(tmp_path):
    results = {
        "results": {
            "lacuna_email_forget_qa": {"alias": "x", "leak_rate,none": 0.25, "leak_rate_stderr,none": 0.1},
            "lacuna_email_retain_qa": {"alias": "y", "accuracy,none": 0.75, "accuracy_stderr,none": 0.1},
        }
    }
    run = tmp_path / "run" / "model"
    run.mkdir(parents=True)
    path = run / "results_2026-01-01T00-00-00.json"
    path.write_text(json.dumps(results))
    assert accuracies_from_lm_eval(path, "lacuna_email_forget_qa", "lacuna_email_retain_qa") == (0.25, 0.75)
    assert accuracies_from_lm_eval(tmp_path / "run", "lacuna_email_forget_qa", "lacuna_email_retain_qa") == (
        0.25,
        0.75,
    )
    with pytest.raises(ValueError, match="no metric 'accuracy'"):
        accuracies_from_lm_eval(path, "lacuna_email_forget_qa", "lacuna_email_retain_qa", "accuracy")
    with pytest.raises(ValueError, match="no metric 'accuracy,none'"):
        accuracies_from_lm_eval(
            path, "lacuna_email_forget_qa", "lacuna_email_retain_qa", "accuracy", filter_name="none"
        )
    with pytest.raises(ValueError, match="lacuna_phone_forget_qa"):
        accuracies_from_lm_eval(path, "lacuna_phone_forget_qa", "lacuna_email_retain_qa")
    # a second run of the same model in the same --output_path: the newest is read (docs/ci.md)
    results["results"]["lacuna_email_forget_qa"]["leak_rate,none"] = 0.5
    (run / "results_2026-01-02T00-00-00.json").write_text(json.dumps(results))
    assert accuracies_from_lm_eval(tmp_path / "run", "lacuna_email_forget_qa", "lacuna_email_retain_qa") == (
        0.5,
        0.75,
    )
    # results of two models under one directory: which one is meant is not guessed
    (tmp_path / "run" / "other").mkdir()
    (tmp_path / "run" / "other" / "results_2026-01-03T00-00-00.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="2 models"):
        accuracies_from_lm_eval(tmp_path / "run", "lacuna_email_forget_qa", "lacuna_email_retain_qa")


def test_cli_reversibility_from_lm_eval_results(tmp_path, capsys):
    from lacuna_unlearn.bench.cli.main import main

    def results(name: str, forget: float, retain: float, held_out: float | None = None, ppl: float = 10.0) -> str:
        path = tmp_path / f"{name}.json"
        body = {
            "results": {
                "lacuna_email_forget_qa": {"leak_rate,none": forget},
                "lacuna_email_retain_qa": {"accuracy,none": retain},
                "lacuna_neutral_ppl": {"word_perplexity,none": ppl},
            }
        }
        if held_out is not None:
            body["results"]["lacuna_email_retain_eval_qa"] = {"accuracy,none": held_out}
        path.write_text(json.dumps(body))
        return str(path)

    out = tmp_path / "regime.json"
    code = main(
        [
            "reversibility", "--original", results("o", 1.0, 1.0, 1.0), "--unlearned", results("u", 0.0, 1.0, 0.0),
            "--relearned", results("r", 0.8, 0.9), "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    # retain QA (trained on) stayed 1.0, held-out retain fell to 0: catastrophic; the gap 0.2 < 0.5: reversible
    assert result["regime"] == "reversible_catastrophic" and result["forget_gap"] == pytest.approx(0.2)
    assert result["catastrophic_inputs"]["neutral_ppl_ratio"]["ratio"] == pytest.approx(1.0)
    assert result["accuracies"]["relearned"] == {"forget": 0.8, "retain (trained on; not read)": 0.9}
    code = main(["reversibility", "--original", str(tmp_path / "nope.json"), "--unlearned", "u", "--relearned", "r"])
    assert code == 2 and "nope.json" in capsys.readouterr().err


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 5), (3, 5), (5, 5), (81, 263), (7, 20)])
def test_wilson_interval_matches_scipy(k, n):
    from scipy.stats import binomtest

    from lacuna_metrics.behaviour.regimes import wilson_interval

    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_leak_separation_is_newcombes_hybrid_score_interval():
    from lacuna_metrics.behaviour.regimes import leak_separation

    # Newcombe (1998), Table II, example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339
    out = leak_separation(56, 70, 48, 80)
    assert out["interval"] == pytest.approx([0.0524, 0.3339], abs=5e-5) and out["separated"]
    # n = 5 people: 3 of 5 back against 0 of 5 learned from scratch barely separates, 2 of 5 does not
    assert leak_separation(3, 5, 0, 5)["separated"] and not leak_separation(2, 5, 0, 5)["separated"]
    assert not leak_separation(5, 5, 5, 5)["separated"]  # the budget teaches everything: nothing to tell apart
    with pytest.raises(ValueError, match="k <= n"):
        leak_separation(6, 5, 0, 5)
