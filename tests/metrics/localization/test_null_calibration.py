"""lacuna_metrics.localization.null_calibration against hand-computed tables (on the smoke testbed:
tests/e2e/test_null_calibration_smoke.py).
"""

from __future__ import annotations

import pytest

from lacuna_metrics.localization.null_calibration import calibrate

AUC = {
    "forget": {"raw": 0.62, "reversal": 0.99, "qtile": 0.55, "composite": None, "best": {"score": "reversal"}},
    "unified": {"raw": 0.50, "reversal": 1.0, "qtile": 0.51, "best": {"score": "reversal"}},
}
NULL = {
    "gaussian": {"raw": {"forget": 0.50, "unified": 0.49}, "reversal": {"forget": 0.97, "unified": 1.0}},
    "adam_sign": {"raw": {"forget": 0.52, "unified": 0.50}, "reversal": {"forget": 0.60, "unified": 0.98}},
}


def test_best_excludes_families_a_null_update_already_wins():
    out = calibrate(AUC, NULL, tolerance=0.05)
    forget = out["targets"]["forget"]
    assert forget["families"]["raw"]["null_auc"] == 0.52  # the highest null AUC
    assert forget["families"]["raw"]["lift"] == pytest.approx(0.10)
    assert forget["families"]["reversal"]["null_auc"] == 0.97
    assert forget["families"]["reversal"]["lift"] == pytest.approx(0.02)
    assert forget["best"] == {"score": "raw", "value": 0.62}  # reversal (0.99) is excluded
    assert forget["best_lift"]["score"] == "raw"
    assert "outside 0.5 ± 0.05" in forget["excluded"]["reversal"]
    assert "no null AUC" in forget["excluded"]["qtile"]  # not scored by the audit: not trusted
    assert "composite" not in forget["families"]  # no value for the method
    unified = out["targets"]["unified"]
    assert unified["best"] == {"score": "raw", "value": 0.50}
    assert unified["best_lift"] == {"score": "raw", "value": pytest.approx(0.0)}  # 0.50 - max(0.49, 0.50)


def test_a_random_update_gets_chance_and_an_oracle_keeps_its_best():
    null = {"gaussian": {"raw": {"forget": 0.501}, "qtile": {"forget": 0.499}}}
    random = calibrate({"forget": {"raw": 0.502, "qtile": 0.498}}, null)["targets"]["forget"]
    assert random["best"]["value"] == pytest.approx(0.502) and abs(random["best_lift"]["value"]) < 0.01
    oracle = calibrate({"forget": {"raw": 1.0, "qtile": 0.97}}, null)["targets"]["forget"]
    assert oracle["best"] == {"score": "raw", "value": 1.0} and oracle["best_lift"]["value"] == pytest.approx(0.499)


def test_degenerate_inputs():
    everything_leaks = calibrate({"forget": {"reversal": 0.9}}, {"gaussian": {"reversal": {"forget": 0.9}}})
    assert everything_leaks["targets"]["forget"]["best"] == {"score": None, "value": None}
    assert everything_leaks["targets"]["forget"]["best_lift"]["value"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, NULL, tolerance=0.5)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(AUC, NULL, tolerance=0.0)
    with pytest.raises(ValueError, match="at least one null"):
        calibrate(AUC, {})
