"""Null-calibrated localization: which scoring families a method-free update can already win, and by how much a
method beats that.

A scoring family reads the update through some statistic (|δ|, δ against the injection, a quantile within its
group ...). Some of those statistics separate masked from unmasked scalars for *any* update on a testbed whose
injection left a trace, so a high AUC there says nothing about the method. The leak audit
(:mod:`lacuna_metrics.localization.leak_audit`) scores null updates (seeded noise that knows nothing of the masks) through every
family; this module sets a method's AUCs beside them (docs/scoring.md, "Null calibration"):

* per family and target: ``auc``, ``null_auc`` (the highest AUC of the null updates: the bar a method must clear),
  ``lift = auc - null_auc``;
* ``best``: the best AUC over the families whose null updates all stay within ``0.5 ± tolerance`` (the rest are
  listed under ``excluded`` with the reason); ``best_lift``: the largest lift over every family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_NULL_SCALES", "DEFAULT_TOLERANCE", "calibrate"]

#: A family counts as null-calibrated when every null update scores within 0.5 ± this.
DEFAULT_TOLERANCE = 0.05
#: Null updates computed by ``lacuna score``: Gaussian noise at 1e-3 × each tensor's RMS, and ±1e-5 on every scalar
#: with random signs (Adam's first steps at lr 1e-5), the leak audit's defaults (lacuna_metrics.localization.leak_audit).
DEFAULT_NULL_SCALES = {"gaussian": 1e-3, "adam_sign": 1e-5}


def calibrate(
    auc: Mapping[str, Mapping[str, Any]],
    null: Mapping[str, Mapping[str, Mapping[str, float | None]]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[str, Any]:
    """The null-calibrated view of one score's ``auc`` section.

    ``auc`` is ``{target: {family: value | None, "best": {...}}}`` (score.json); ``null`` is the leak audit's
    ``{null kind: {family: {target: value | None}}}``. Families without a null value (the audit did not score them)
    are excluded, not trusted. Returns ``{"tolerance", "targets": {target: {"families", "best", "best_lift",
    "excluded"}}}``.
    """
    if not 0.0 < float(tolerance) < 0.5:
        raise ValueError(f"null-AUC tolerance must be in (0, 0.5), got {tolerance!r}")
    if not null:
        raise ValueError("null calibration needs at least one null update's AUCs")
    targets: dict[str, Any] = {}
    for target, scores in auc.items():
        families: dict[str, Any] = {}
        excluded: dict[str, str] = {}
        for family, value in scores.items():
            if family == "best" or value is None:
                continue
            by_kind = {kind: (table.get(family) or {}).get(target) for kind, table in null.items()}
            known = {k: v for k, v in by_kind.items() if v is not None}
            if not known:
                excluded[family] = "no null AUC (the null updates were not scored by this family)"
                continue
            null_auc = max(known.values())  # the bar a method must clear: the best a method-free update gets
            families[family] = {
                "auc": float(value),
                "null_auc": float(null_auc),
                "null_auc_by_kind": known,
                "lift": float(value) - float(null_auc),
            }
            off = max(known.values(), key=lambda v: abs(v - 0.5))
            if abs(off - 0.5) > tolerance:
                excluded[family] = f"null AUC {off:.3f} outside 0.5 ± {tolerance}"
        calibrated = {f: e["auc"] for f, e in families.items() if f not in excluded}
        best = max(calibrated, key=lambda f: calibrated[f]) if calibrated else None
        lifted = max(families, key=lambda f: families[f]["lift"]) if families else None
        targets[target] = {
            "families": families,
            "best": {"score": best, "value": calibrated[best] if best else None},
            "best_lift": {"score": lifted, "value": families[lifted]["lift"] if lifted else None},
            "excluded": excluded,
        }
    return {"tolerance": float(tolerance), "targets": targets}
