"""The human view of a score JSON: markdown tables (AUCs per score and target, baselines, FRAG, distance, layers);
its figures are in :mod:`lacuna_metrics.plots`. A ``lacuna run``'s report is :mod:`lacuna_unlearn.bench.report`.
See docs/report.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lacuna_metrics.localization.auc import TARGETS

__all__ = ["fmt", "markdown_summary", "update_warning"]


def fmt(value: Any, digits: int = 4) -> str:
    """One table cell: ``n/a`` for a missing value, a float to ``digits`` places, anything else as it prints."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(target: Mapping[str, Any] | None) -> str:
    """The calibrated verdict of one target as a cell: ``**raw** 0.9123 (+0.4100)``, or why there is none."""
    best = (target or {}).get("best") or {}
    if best.get("value") is None:
        return "none passed"
    lift = ((target or {}).get("best_lift") or {}).get("value")
    return f"**{best['score']}** {fmt(best['value'])}" + ("" if lift is None else f" ({lift:+.4f})")


def update_warning(result: Mapping[str, Any]) -> str | None:
    """A warning for an update that cannot be scored as one: zero (after equals before), so every score ties and
    every AUC is 0.5 by construction."""
    l2 = (result.get("distance") or {}).get("l2")
    if l2 is not None and l2 == 0:
        return "the update is zero (after equals before): every score ties, every AUC is 0.5 by construction"
    return None


def _ties_note(qtile_ties: str | None) -> str:
    """How tied scores count, which depends on how qtile ranked them (docs/scoring.md, "Ties in qtile")."""
    if qtile_ties == "ordinal":
        return (
            "Tied scores count ½, except in qtile and crossfield: with --qtile-ties ordinal (the release code's "
            "stable argsort) tied |δ| get distinct ranks in index order, which structured masks can read as signal."
        )
    if qtile_ties == "average":
        return "Tied scores count ½; qtile and crossfield give tied |δ| their average rank, so they stay tied."
    return "Tied scores count ½."  # a score JSON from before the setting was recorded


def markdown_summary(result: dict[str, Any]) -> str:
    """The score JSON as markdown tables: AUCs per score and target, baselines, FRAG, distance, layers."""
    inputs = result["manifest"]["inputs"]
    lines = [
        f"# lacuna score: `{inputs['after']['path']}`",
        "",
        f"after: `{inputs['after'].get('fingerprint')}`  ",
        f"before: `{inputs['before']['path']}` (`{inputs['before'].get('fingerprint')}`)",
    ]
    if "base" in inputs:
        lines[-1] += "  "
        lines.append(f"base (reversal reference): `{inputs['base']['path']}` (`{inputs['base'].get('fingerprint')}`)")
    lines.append("")
    warning = update_warning(result)
    if warning:
        lines += [f"**Warning: {warning}**", ""]
    auc = result.get("auc")
    if auc:
        targets = list(TARGETS)
        lines += [
            "## Localization ROC-AUC",
            "",
            "Higher = the update concentrates on the masked scalars of the forgotten facts; 0.5 = no better than chance.",
            "",
            "| score | " + " | ".join(targets) + " |",
            "|---|" + "---|" * len(targets),
        ]
        scores = [s for s in auc["forget"] if s != "best"]
        calibrated = (result.get("null_calibration") or {}).get("targets") or {}

        def cell(t: str, s: str) -> str:  # † marks a family the null calibration excluded for that target
            excluded = s in ((calibrated.get(t) or {}).get("excluded") or {})
            return fmt(auc[t].get(s)) + (" †" if excluded and auc[t].get(s) is not None else "")

        for s in scores:
            if all(auc[t].get(s) is None for t in targets):
                continue
            lines.append(f"| {s} | " + " | ".join(cell(t, s) for t in targets) + " |")
        if calibrated:
            lines.append(
                "| **calibrated best** (lift) | " + " | ".join(_verdict(calibrated.get(t)) for t in targets) + " |"
            )
        if calibrated:  # the verdict above; the uncalibrated best is a plain row for comparison with the paper
            best = " | ".join(f"{auc[t]['best']['score']} {fmt(auc[t]['best']['value'])}" for t in targets)
            lines.append(f"| best, uncalibrated | {best} |")
        else:
            best = " | ".join(f"**{auc[t]['best']['score']}** {fmt(auc[t]['best']['value'])}" for t in targets)
            lines.append(f"| best | {best} |")
        for name in result["baselines"]["forget"]:
            values = " | ".join(fmt(result["baselines"][t][name]) for t in targets)
            lines.append(f"| baseline: {name} (no after-model) | {values} |")
        if calibrated:
            null = result.get("null_calibration") or {}
            lines += [
                "",
                "† not calibrated: a method-free update of this update's own size, shape and dtype (its δ permuted "
                "within |θ| strata, |θ|-shaped noise, weight decay, Gaussian noise) already moves that family's AUC "
                f"away from 0.5 ± {fmt(null.get('tolerance'), 3)}, or the update does not beat those nulls by more "
                f"than {fmt(null.get('z'), 1)} null standard deviations and {fmt(null.get('min_lift'), 3)} AUC "
                f"({null.get('draws', '?')} draws per null kind on {(null.get('sample') or {}).get('scalars', '?')} "
                "sampled scalars). The verdict is the calibrated best and its lift over the nulls; the uncalibrated "
                "best is kept for comparison with the paper (docs/scoring.md, 'Null calibration').",
            ]
        bounds = [b for t in targets for b in result["auc_error_bound"][t].values()]
        worst = max(bounds) if bounds else 0.0
        lines += ["", "All AUCs exact." if worst == 0 else f"Largest AUC error bound: {worst:.2e} (histogram mode)."]
        lines[-1] += " " + _ties_note((result.get("localization_settings") or {}).get("qtile_ties"))
        if result["not_applicable"]:
            lines += ["", "Not computed: " + "; ".join(f"{k} ({v})" for k, v in result["not_applicable"].items())]
        universe = result["universe"]
        lines += [
            "",
            f"Universe: {universe['tensors']} tensors, {universe['scalars']:,} scalars "
            f"(forget {universe['forget']:,}, retain {universe['retain']:,}, outside {universe['outside']:,}).",
            "",
        ]
    frag = result.get("frag")
    if frag:
        lines += ["## FRAG", ""]
        if "skipped" in frag:
            lines.append(f"skipped: {frag['skipped']}")
        else:
            lines += [
                "| forget alignment A_f | retain alignment A_r | gamma | FRAG | FRAG (%) |",
                "|---|---|---|---|---|",
                f"| {fmt(frag['forget_alignment'])} | {fmt(frag['retain_alignment'])} | {frag['gamma']:g} "
                f"| {fmt(frag['frag'])} | {100 * frag['frag']:.2f} |",
            ]
        lines.append("")
    distance = result.get("distance")
    if distance:
        lines += ["## Distance", "", f"Global L2 ‖W_after − W_before‖ over all weights: {distance['l2']:.6g}", ""]
    per_layer = result.get("per_layer") or []
    if per_layer:
        score = (result.get("localization_settings") or {}).get("per_layer_score", "qtile")
        lines += [
            f"## Per layer and component ({score} AUC; share of the squared update inside each mask)",
            "",
            "| layer | component | AUC forget | AUC unified | AUC forget_vs_retain | mass forget | mass retain | mass outside |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in per_layer:
            a, m = row["auc"], row["update_mass"]
            lines.append(
                f"| {row['layer']} | {row['component']} | {fmt(a['forget'])} | {fmt(a['unified'])} | "
                f"{fmt(a['forget_vs_retain'])} | {fmt(m['forget'], 3)} | {fmt(m['retain'], 3)} | {fmt(m['outside'], 3)} |"
            )
        lines.append("")
    return "\n".join(lines)
