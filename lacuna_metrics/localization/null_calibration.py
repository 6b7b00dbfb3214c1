"""Null-calibrated localization: does the update beat method-free updates of its own size, shape and dtype, and by
how much?

A scoring family reads the update through some statistic (|δ|, δ against the injection, a quantile within its
tensor ...). On a testbed whose injection left a trace in |θ|, or for an update whose size follows |θ|, a family can
separate masked from unmasked scalars without any knowledge of the masks. The null updates of
:mod:`lacuna_metrics.localization.nulls` are built from the scored update itself (its δ permuted within |θ| strata,
|θ|-shaped noise and weight decay at its per-tensor norm, Gaussian noise at its RMS), drawn several times each and
scored on the same sample as the update. Per family and target (docs/scoring.md, "Null calibration"):

* ``null_auc``: the highest mean AUC over the null kinds (the bar), ``null_sd``: the largest spread (sample std over
  draws) of a random kind, ``lift = sample_auc − null_auc`` (the method on the same sample), ``z = lift / null_sd``;
* a family is **calibrated** when every null kind's mean AUC is within ``0.5 ± tolerance`` (else it reads what a
  method-free update of this shape already reveals) and its lift exceeds both ``z × null_sd`` (the update beats its
  nulls beyond their spread, estimated from a few draws) and ``min_lift`` (a floor: tens of family x target tests
  are read per score, and a spread from six draws is itself uncertain); the rest are listed under ``excluded``
  with the reason;
* ``best``: the calibrated family with the highest AUC (``auc``: the full universe's), ``best_lift``: that same
  family's lift. Where no family is calibrated, both are null and ``best.reason`` says why.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lacuna_metrics.localization.nulls import NULL_KINDS, RANDOM_KINDS, NullSample, null_deltas, sample_aucs

__all__ = [
    "DEFAULT_DRAWS",
    "DEFAULT_MIN_LIFT",
    "DEFAULT_NULL_SAMPLES",
    "DEFAULT_TOLERANCE",
    "DEFAULT_Z",
    "calibrate",
    "calibrate_sample",
    "check_settings",
]

#: A family is calibrated only when every null kind's mean AUC stays within 0.5 ± this: beyond it the family reads
#: mostly what |θ| already reveals. 0.1 matches the testbed build gate's ceiling of 0.60 on method-free detectors
#: (docs/testbeds.md, "Leak audit"), so on a testbed that passes its gate the magnitude families can be calibrated;
#: the verdict itself rests on the spread rule (``z``, ``min_lift``), which is what rejects method-free updates.
DEFAULT_TOLERANCE = 0.1
#: ... and the update's lift over its nulls exceeds this many null standard deviations.
DEFAULT_Z = 3.0
#: ... and at least this much AUC.
DEFAULT_MIN_LIFT = 0.01
#: Draws of each random null kind (the spread's estimate).
DEFAULT_DRAWS = 6
#: Scalars of the universe sampled for the nulls (the whole universe when smaller).
DEFAULT_NULL_SAMPLES = 200_000
#: Rows of that sample the composite is refitted on, per null draw, and its draws per random kind.
COMPOSITE_ROWS = 30_000
COMPOSITE_DRAWS = 2


def calibrate_sample(
    auc: Mapping[str, Mapping[str, Any]],
    sample: NullSample,
    *,
    families: Sequence[str],
    composite: Sequence[str] = (),
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    z: float = DEFAULT_Z,
    min_lift: float = DEFAULT_MIN_LIFT,
    threads: int = 1,
    ties: str = "average",
    folds: int = 5,
) -> tuple[dict[str, Any], float]:
    """The ``null_calibration`` section of score.json and its wall seconds (recorded with the manifest's timings):
    every null kind drawn on ``sample`` and scored by ``families`` (and the composite, refitted with the features
    ``composite``), the update itself scored on the same sample, then :func:`calibrate` against the full-universe
    ``auc`` section."""
    check_settings(tolerance, z, min_lift, draws)
    started = time.perf_counter()
    rows = None
    if composite:
        rng = np.random.default_rng(seed)
        k = min(sample.size, COMPOSITE_ROWS)
        rows = np.sort(rng.choice(sample.size, size=k, replace=False)) if k < sample.size else None
    d = sample.after - sample.before
    kw = {"composite_rows": rows, "folds": folds, "threads": threads, "ties": ties}
    method = sample_aucs(sample, d, families, composite=composite, **kw)
    null: dict[str, list[dict[str, dict[str, float | None]]]] = {}
    for kind in NULL_KINDS:
        null[kind] = []
        for draw in range(draws if kind in RANDOM_KINDS else 1):
            with_composite = composite if draw < COMPOSITE_DRAWS else ()
            dn = null_deltas(sample, kind, draw, seed)
            null[kind].append(sample_aucs(sample, dn, families, composite=with_composite, **kw))
    out = calibrate(auc, method, null, tolerance=tolerance, z=z, min_lift=min_lift)
    out.update(
        {
            "kinds": dict(NULL_KINDS),
            "draws": draws,
            "composite_draws": min(draws, COMPOSITE_DRAWS) if composite else 0,
            "composite_rows": int(rows.size if rows is not None else sample.size) if composite else 0,
            "seed": seed,
            "sample": {"scalars": sample.size, "universe_scalars": sample.universe_scalars},
            "stored_as": sorted({str(r).removeprefix("torch.") for r in sample.rounding if r is not None}),
        }
    )
    seconds = round(time.perf_counter() - started, 3)  # not in the section: the same inputs give the same section
    return out, seconds


def calibrate(
    auc: Mapping[str, Mapping[str, Any]],
    method: Mapping[str, Mapping[str, float | None]],
    null: Mapping[str, Sequence[Mapping[str, Mapping[str, float | None]]]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    z: float = DEFAULT_Z,
    min_lift: float = DEFAULT_MIN_LIFT,
) -> dict[str, Any]:
    """The calibrated view of one score's ``auc`` section (``{target: {family: value | None, "best": ...}}``).

    ``method`` is the update's ``{family: {target: AUC}}`` on the null sample, ``null`` the nulls' ``{kind: [one
    such table per draw]}``. Families the nulls were not scored by are excluded, not trusted. Returns
    ``{"tolerance", "z", "min_lift", "targets": {target: {"families", "best", "best_lift", "excluded"}}}``.
    """
    check_settings(tolerance, z, min_lift)
    if not null or not any(null.values()):
        raise ValueError("null calibration needs at least one null update's AUCs")
    targets: dict[str, Any] = {}
    for target, scores in auc.items():
        families: dict[str, Any] = {}
        excluded: dict[str, str] = {}
        for family, value in scores.items():
            if family == "best" or value is None:
                continue
            own = (method.get(family) or {}).get(target)
            by_kind = _by_kind(null, family, target)
            if own is None or not by_kind:
                excluded[family] = _not_scored(family)
                continue
            null_auc = max(k["mean"] for k in by_kind.values())
            spreads = [k["sd"] for k in by_kind.values() if k["sd"] is not None]
            null_sd = max(spreads) if spreads else 0.0
            lift = float(own) - null_auc
            families[family] = {
                "auc": float(value),
                "sample_auc": float(own),
                "null_auc": null_auc,
                "null_sd": null_sd,
                "null_auc_by_kind": by_kind,
                "lift": lift,
                "z": lift / null_sd if null_sd > 0 else (math.inf if lift > 0 else 0.0),
            }
            off = max(by_kind.items(), key=lambda kv: abs(kv[1]["mean"] - 0.5))
            if abs(off[1]["mean"] - 0.5) > tolerance:
                excluded[family] = f"null AUC {off[1]['mean']:.3f} ({off[0]}) outside 0.5 ± {tolerance}"
            elif not lift > max(z * null_sd, min_lift):
                excluded[family] = (
                    f"not above its null: lift {lift:+.4f} <= max({z:g} x spread {null_sd:.4f}, {min_lift:g})"
                )
        calibrated = {f: e["auc"] for f, e in families.items() if f not in excluded}
        best = max(calibrated, key=lambda f: calibrated[f]) if calibrated else None
        if best is None:
            verdict: dict[str, Any] = {"score": None, "value": None, "reason": _no_verdict(families, excluded)}
            lift_entry: dict[str, Any] = {"score": None, "value": None}
        else:
            verdict = {"score": best, "value": calibrated[best]}
            lift_entry = {"score": best, "value": families[best]["lift"]}  # the verdict's own family
        targets[target] = {"families": families, "best": verdict, "best_lift": lift_entry, "excluded": excluded}
    return {"tolerance": float(tolerance), "z": float(z), "min_lift": float(min_lift), "targets": targets}


def _by_kind(
    null: Mapping[str, Sequence[Mapping[str, Mapping[str, float | None]]]], family: str, target: str
) -> dict[str, dict[str, Any]]:
    """Per null kind: the draws' AUCs of ``family`` on ``target``, their mean and sample std (None: one draw)."""
    out: dict[str, dict[str, Any]] = {}
    for kind, tables in null.items():
        values = [v for t in tables if (v := (t.get(family) or {}).get(target)) is not None]
        if values:
            out[kind] = {
                "mean": float(statistics.fmean(values)),
                "sd": float(statistics.stdev(values)) if len(values) > 1 else None,
                "draws": [round(float(v), 6) for v in values],
            }
    return out


def _not_scored(family: str) -> str:
    if family == "crossfield":
        return "reads only the per-field runs: a null update scores exactly what the method scores (lift 0)"
    return "no null AUC (the null updates were not scored by this family)"


def check_settings(
    tolerance: float,
    z: float,
    min_lift: float,
    draws: int = DEFAULT_DRAWS,
    samples: int = DEFAULT_NULL_SAMPLES,
    *,
    names: Mapping[str, str] | None = None,
) -> None:
    """Refuse settings that could not calibrate, before any work (one line naming the setting as the caller's user
    typed it: ``names`` maps ``tolerance``, ``z``, ``min_lift``, ``draws``, ``samples`` to flag names)."""
    name = {
        k: (names or {}).get(k, f"null {k.replace('_', ' ')}")
        for k in ("tolerance", "z", "min_lift", "draws", "samples")
    }
    if not 0.0 < float(tolerance) < 0.5:
        raise ValueError(f"{name['tolerance']} must be in (0, 0.5), got {tolerance!r}")
    if not (math.isfinite(float(z)) and float(z) >= 0):
        raise ValueError(f"{name['z']} must be a finite number >= 0, got {z!r}")
    if not 0.0 <= float(min_lift) < 0.5:
        raise ValueError(f"{name['min_lift']} must be in [0, 0.5), got {min_lift!r}")
    if int(draws) < 2:
        raise ValueError(f"{name['draws']} must be at least 2 (the null's spread needs two draws), got {draws!r}")
    if int(samples) < 1000:
        raise ValueError(f"{name['samples']} must be at least 1000, got {samples!r}")


def _no_verdict(families: Mapping[str, Any], excluded: Mapping[str, str]) -> str:
    """Why a target has no calibrated best: which families were scored and why each one fell."""
    if not families and not excluded:
        return "no family scored this target"
    reasons = "; ".join(f"{family}: {why}" for family, why in sorted(excluded.items()))
    return f"no family passed the null calibration ({reasons})"
