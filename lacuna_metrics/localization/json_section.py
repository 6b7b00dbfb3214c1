"""The localization section of score.json, assembled from a finished run's summaries (README, "Score JSON").

:class:`~lacuna_metrics.localization.precision.Localization` hands over what its accumulators, group statistics and composite
produced; nothing here reads checkpoints or computes scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lacuna_metrics.localization.auc import FORGET, OUTSIDE, RETAIN, TARGETS
from lacuna_metrics.localization.families import BASELINES, SCORES
from lacuna_metrics.localization.group_stats import GroupStats

__all__ = ["per_layer_rows", "score_tables", "universe_record"]

_MASS = (("forget", FORGET), ("retain", RETAIN), ("outside", OUTSIDE))  # per_layer update_mass, in its order


def score_tables(
    scores: Sequence[str],
    baselines: Sequence[str],
    not_applicable: Mapping[str, str],
    summary: tuple[Mapping[tuple[str, str], Any], Mapping[tuple[str, str], Any], Mapping[tuple[str, str], Any]],
    composite: dict[str, Any] | None,
) -> dict[str, Any]:
    """``auc`` (with ``best`` per target), ``auc_error_bound``, ``precision_at_k``, ``baselines``, ``roc`` and
    ``composite`` (without its ROC, which joins ``roc``) from :meth:`ScoreSinks.summary`'s ``summary``.

    A score that is not applicable is ``None`` in ``auc`` (and so never ``best``)."""
    results, precisions, curves = summary
    composite_roc = composite.pop("roc", {}) if composite is not None else {}
    auc: dict[str, dict[str, Any]] = {}
    bounds: dict[str, dict[str, float]] = {}
    precision: dict[str, dict[str, Any]] = {}
    base: dict[str, dict[str, float | None]] = {}
    roc: dict[str, dict[str, Any]] = {}
    for target in TARGETS:
        auc[target], bounds[target], precision[target], roc[target] = {}, {}, {}, {}
        for s in scores:
            auc[target][s] = results[s, target].value
            bounds[target][s] = results[s, target].error_bound
            precision[target][s] = precisions[s, target]
            roc[target][s] = curves[s, target]
        for s in not_applicable:
            if s in SCORES:
                auc[target][s] = None
        if composite is not None:
            auc[target]["composite"] = composite["auc"].get(target)
            if composite_roc.get(target) is not None:  # so the plots can draw the best score when it is this one
                roc[target]["composite"] = composite_roc[target]
        scored = {s: v for s, v in auc[target].items() if v is not None}
        best = max(scored, key=lambda s: scored[s]) if scored else None
        auc[target]["best"] = {"score": best, "value": scored[best] if best else None}
        base[target] = {b: results[b, target].value for b in baselines}
        base[target].update({b: None for b in BASELINES if b in not_applicable})
        for b in baselines:
            roc[target][b] = curves[b, target]
    return {
        "auc": auc,
        "auc_error_bound": bounds,
        "precision_at_k": precision,
        "baselines": base,
        "not_applicable": dict(not_applicable),
        "composite": composite,
        "roc": roc,
    }


def per_layer_rows(
    stats: Mapping[tuple[int, str], GroupStats],
    group_auc: Mapping[tuple[int, str], Mapping[str, tuple[float | None, float]]],
    tensors: Mapping[tuple[int, str], list[str]],
) -> list[dict[str, Any]]:
    """``per_layer``: one row per (layer, component) group of the universe, sorted, with its per-layer AUCs and
    the share of the update energy on forget / retain / outside scalars."""
    rows = []
    for key, group in sorted(stats.items()):
        auc = group_auc[key]
        energy = sum(group.energy)
        rows.append(
            {
                "layer": key[0],
                "component": key[1],
                "tensors": tensors[key],
                "scalars": group.n,
                "auc": {t: auc[t][0] for t in TARGETS},
                "auc_error_bound": {t: auc[t][1] for t in TARGETS},
                "update_mass": {c: group.energy[i] / energy if energy else None for c, i in _MASS},
            }
        )
    return rows


def universe_record(names: Sequence[str], stats: Mapping[tuple[int, str], GroupStats]) -> dict[str, Any]:
    """``universe``: its tensors and scalar counts per category."""
    counts = [sum(s.counts[c] for s in stats.values()) for c in range(3)]
    return {
        "tensors": len(names),
        "scalars": sum(counts),
        "forget": counts[FORGET],
        "retain": counts[RETAIN],
        "outside": counts[OUTSIDE],
        "names": list(names),
    }
