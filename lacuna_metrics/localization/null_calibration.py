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
  listed under ``excluded`` with their null AUC and the reason); ``best_lift``: that same family's lift, so a verdict
  never pairs one family's AUC with another's lift. Where no family passes, both are null and ``best`` says why.
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
        if best is None:
            verdict: dict[str, Any] = {"score": None, "value": None, "reason": _no_verdict(families, excluded)}
            lift: dict[str, Any] = {"score": None, "value": None}
        else:
            verdict = {"score": best, "value": calibrated[best]}
            lift = {"score": best, "value": families[best]["lift"]}  # the verdict's own family, never another's
        targets[target] = {"families": families, "best": verdict, "best_lift": lift, "excluded": excluded}
    return {"tolerance": float(tolerance), "targets": targets}


def _no_verdict(families: Mapping[str, Any], excluded: Mapping[str, str]) -> str:
    """Why a target has no calibrated best: which families were scored and why each one fell."""
    if not families and not excluded:
        return "no family scored this target"
    reasons = "; ".join(f"{family}: {why}" for family, why in sorted(excluded.items()))
    return f"no family passed the null calibration ({reasons})"
