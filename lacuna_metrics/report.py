"""Human views of results: a score JSON (markdown, ROC curves with the best score's, layer heatmaps) and a
``lacuna run`` results JSON (per field the LACUNA-style table with persons beside every rate, a one-line legend per
column, the regime footnote; AUC / update-location / relearning plots). See docs/report.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lacuna_metrics.auc import TARGETS
from lacuna_metrics.manifest import save_figure

__all__ = ["markdown_summary", "run_markdown", "write_plots", "write_run_report"]


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


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
        for s in scores:
            if all(auc[t].get(s) is None for t in targets):
                continue
            lines.append(f"| {s} | " + " | ".join(_fmt(auc[t].get(s)) for t in targets) + " |")
        best = " | ".join(f"**{auc[t]['best']['score']}** {_fmt(auc[t]['best']['value'])}" for t in targets)
        lines.append(f"| best | {best} |")
        for name in result["baselines"]["forget"]:
            values = " | ".join(_fmt(result["baselines"][t][name]) for t in targets)
            lines.append(f"| baseline: {name} (no after-model) | {values} |")
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
                f"| {_fmt(frag['forget_alignment'])} | {_fmt(frag['retain_alignment'])} | {frag['gamma']:g} "
                f"| {_fmt(frag['frag'])} | {100 * frag['frag']:.2f} |",
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
                f"| {row['layer']} | {row['component']} | {_fmt(a['forget'])} | {_fmt(a['unified'])} | "
                f"{_fmt(a['forget_vs_retain'])} | {_fmt(m['forget'], 3)} | {_fmt(m['retain'], 3)} | {_fmt(m['outside'], 3)} |"
            )
        lines.append("")
    return "\n".join(lines)


#: What each localization target separates (titles of the ROC panels and the AUC plot).
_TARGET_TITLES = {
    "forget": "AUC(F): forget scalars vs every other masked scalar",
    "unified": "AUC(F-R): forget + retain scalars vs outside",
    "forget_vs_retain": "AUC(F vs R): forget vs retain scalars",
}


def roc_series(result: dict[str, Any], target: str, top: int = 3) -> list[dict[str, Any]]:
    """The curves ``roc.png`` draws for ``target``, in drawing order: the ``best`` score first (``kind`` "best";
    ``curve`` None when the score JSON holds no curve for it, as for a composite scored before its curve was
    stored), then the next ``top`` scores by AUC, then the baselines. Each: kind, score, auc, label, curve."""
    auc = result["auc"][target]
    roc = (result.get("roc") or {}).get(target) or {}
    series: list[dict[str, Any]] = []
    best = auc.get("best") or {}
    name = best.get("score")
    if name is not None and best.get("value") is not None:
        curve = roc.get(name) or None
        note = "" if curve else "; curve not stored"
        series.append(
            {"kind": "best", "score": name, "auc": best["value"], "curve": curve,
             "label": f"best: {name} ({best['value']:.3f}{note})"}
        )  # fmt: skip
    ranked = sorted(
        (s for s, v in auc.items() if s not in ("best", name) and v is not None and roc.get(s)),
        key=lambda s: -auc[s],
    )[:top]
    series += [
        {"kind": "score", "score": s, "auc": auc[s], "curve": roc[s], "label": f"{s} ({auc[s]:.3f})"} for s in ranked
    ]
    for b, v in ((result.get("baselines") or {}).get(target) or {}).items():
        if v is not None and roc.get(b):
            series.append(
                {"kind": "baseline", "score": b, "auc": v, "curve": roc[b], "label": f"baseline {b} ({v:.3f})"}
            )
    return series


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: dict[str, Any], out_dir: str | os.PathLike[str], top: int = 3) -> list[Path]:
    """Write ``roc.png`` (per target: the best score's curve, the next ``top`` scores and the baselines) and
    ``layers.png`` (per layer and component: AUC and share of the update inside the forget masks)."""
    plt = _pyplot()
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if result.get("roc") and result.get("auc"):
        fig, axes = plt.subplots(1, len(TARGETS), figsize=(5.6 * len(TARGETS), 5.6), layout="constrained")
        for ax, target in zip(axes, TARGETS, strict=True):
            for entry in roc_series(result, target, top):
                style = {
                    "best": {"color": "black", "linewidth": 2.6, "zorder": 5},
                    "score": {"linewidth": 1.4},
                    "baseline": {"linestyle": "--", "linewidth": 1.4},
                }[entry["kind"]]
                curve = entry["curve"] or {"fpr": [], "tpr": []}
                ax.plot(curve["fpr"], curve["tpr"], label=entry["label"], **style)
            ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="chance (0.500)")
            ax.set_title(_TARGET_TITLES.get(target, target), fontsize=11)
            ax.set(xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1.01))
            ax.set_aspect("equal")
            ax.legend(fontsize=8.5, loc="lower right")
        fig.suptitle("ROC of the update's scores: which scalars did the unlearning update change most?", fontsize=12)
        written.append(save_figure(fig, out / "roc.png"))
    per_layer = result.get("per_layer") or []
    if per_layer:
        score = (result.get("localization_settings") or {}).get("per_layer_score", "qtile")
        layers = sorted({r["layer"] for r in per_layer})
        comps = sorted({r["component"] for r in per_layer})
        auc = np.full((len(layers), len(comps)), np.nan)
        inside = np.full_like(auc, np.nan)
        for r in per_layer:
            i, j = layers.index(r["layer"]), comps.index(r["component"])
            mass = r["update_mass"]
            inside[i, j] = np.nan if mass["forget"] is None else mass["forget"]
            # no update there: its AUC (a constant score, 0.5) says nothing, so both cells read "no update"
            auc[i, j] = np.nan if r["auc"]["forget"] is None or mass["forget"] is None else r["auc"]["forget"]
        fig, axes = plt.subplots(1, 2, figsize=(4 + 2.2 * len(comps), 2.4 + 0.55 * len(layers)), layout="constrained")
        for ax, data, title, cmap in (
            (axes[0], auc, f"AUC(F) per layer ({score})", "RdBu_r"),
            (axes[1], inside, "share of update mass in forget masks", "viridis"),
        ):
            _heatmap(ax, data, [str(v) for v in layers], comps, cmap, label=title)
            ax.set_title(title, fontsize=11)
            ax.set_ylabel("layer", fontsize=10)
        fig.supxlabel("grey: the update left this layer and component unchanged", fontsize=9, color="#555555")
        written.append(save_figure(fig, out / "layers.png"))
    return written


def _heatmap(ax, data, rows: list[str], cols: list[str], cmap: str, *, label: str, digits: int = 2) -> Any:
    """An annotated heatmap in [0, 1]; cells without a value (the update did not touch them) are grey, "no update"."""
    import numpy as np
    from matplotlib import colormaps

    masked = np.ma.masked_invalid(data)
    colors = colormaps[cmap].with_extremes(bad="#d9d9d9")
    image = ax.imshow(masked, vmin=0, vmax=1, cmap=colors, aspect="auto")
    tilt = len(cols) > 4 and max(len(part) for c in cols for part in c.split("\n")) > 6  # crowded: slanted
    ax.set_xticks(range(len(cols)), cols, fontsize=9, rotation=30 if tilt else 0, ha="right" if tilt else "center")
    ax.set_yticks(range(len(rows)), rows, fontsize=9)
    small = len(cols) > 8
    for (i, j), v in np.ndenumerate(data):
        if np.isnan(v):
            ax.text(j, i, "no\nupdate", ha="center", va="center", fontsize=7, color="#555555")
        else:
            rgba = colors(float(v))
            dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
            ax.text(j, i, f"{v:.{digits}f}", ha="center", va="center", fontsize=7.5 if small else 9,
                    color="white" if dark else "black")  # fmt: skip
    ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02).set_label(label, fontsize=8)
    return image


# --------------------------------------------------------------------------- lacuna run: report.md


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _interval(ci: Any) -> str:
    """`` [lo, hi]`` from a two-number interval, else nothing (intervals are shown where the results carry them)."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return ""


def _n(n: Any) -> str:
    return f" (n={n})" if isinstance(n, int) and not isinstance(n, bool) else ""


def _rate(block: dict[str, Any], key: str) -> str:
    """``0.50 [0.20, 0.80] (n=6)`` for metric ``key`` of a behaviour block (its ``n`` and ``ci`` maps)."""
    value = block.get(key)
    if value is None:
        return "n/a"
    return f"{value:.2f}{_interval((block.get('ci') or {}).get(key))}{_n((block.get('n') or {}).get(key))}"


def _change(before: Any, after: Any, n: Any, ci_before: Any = None, ci_after: Any = None) -> str:
    """``0.00 → 1.00 (n=1)``: a rate on the unlearned model and after the relearning attack."""
    if before is None and after is None:
        return "n/a"
    return f"{_pct(before)}{_interval(ci_before)} → {_pct(after)}{_interval(ci_after)}{_n(n)}"


def _relearned(beh: dict[str, Any], rel: dict[str, Any], key: str) -> str:
    """A behaviour rate unlearned → after relearning (the same people: ``n`` from ``beh`` unless ``rel`` has it)."""
    if not rel:
        return _rate(beh, key)
    n = (rel.get("n") or beh.get("n") or {}).get(key)
    return _change(beh.get(key), rel.get(key), n, (beh.get("ci") or {}).get(key), (rel.get("ci") or {}).get(key))


def _fields(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per field: ``baseline`` and ``methods`` (every field of ``by_field``; older results: the top-level field)."""
    by_field = results.get("by_field")
    if isinstance(by_field, dict) and by_field:
        return by_field
    return {results.get("field", "?"): {"baseline": results.get("baseline") or {}, "methods": results.get("methods")}}


def disagrees(method: dict[str, Any]) -> bool:
    """Whether a method's regime and its Success@N after relearning point different ways: "irreversible" while the
    extraction probe still finds forget facts after relearning, or "reversible" while it finds none."""
    regime, attack = method.get("regime") or {}, method.get("attack") or {}
    success = attack.get("success_at_n_relearned")
    if success is None or regime.get("reversible") is None:
        return False
    return (regime["reversible"] is False and success > 0) or (regime["reversible"] is True and success == 0)


def _ppl(behaviour: dict[str, Any]) -> str:
    """The baseline's neutral word perplexity (the denominator of the methods' ratio)."""
    value = behaviour.get("neutral_word_perplexity")
    return "n/a" if value is None else f"ppl {value:.4g}"


def _ppl_ratio(behaviour: dict[str, Any]) -> str:
    """Neutral word perplexity after / before unlearning (> 1: general language modelling got worse)."""
    value = behaviour.get("neutral_ppl_ratio")
    return "n/a" if value is None else f"×{value:.3f}"


def _field_table(entry: dict[str, Any], trivial: dict[str, Any], attempts: Any) -> tuple[list[str], bool]:
    base = (entry.get("baseline") or {}).get("behaviour") or {}
    lines = [
        f"| method | forget EM / ES / Prob | forget leak: unlearned → relearned | retain acc: unlearned → relearned "
        f"| held-out retain acc | cross-field acc | neutral ppl ratio | J_W | AUC(F) | AUC(F-R) | AUC(F vs R) | FRAG "
        f"| Success@{attempts}: unlearned → relearned | regime |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def memorization(b: dict[str, Any]) -> str:
        values = [b.get(k) for k in ("em", "es", "prob")]
        if all(v is None for v in values):
            return "n/a"
        n = next((v for v in ((b.get("n") or {}).get(k) for k in ("em", "es", "prob")) if v is not None), None)
        return " / ".join(_pct(v) for v in values) + _n(n)

    lines.append(
        f"| before unlearning | {memorization(base)} | {_rate(base, 'forget_leak')} | {_rate(base, 'retain_accuracy')} "
        f"| {_rate(base, 'retain_eval_accuracy')} | {_rate(base, 'crossfield_accuracy')} | {_ppl(base)} "
        f"| {_rate(base, 'j_w')} | | | | | | |"
    )
    footnote = False
    for name, m in (entry.get("methods") or {}).items():
        beh, auc, att = m.get("behaviour") or {}, m.get("auc") or {}, m.get("attack") or {}
        rel = m.get("relearned_behaviour") or {}

        def best(target: str, auc: dict = auc) -> str:
            entry = auc.get(target) or {}
            if "calibrated_best" in entry and entry["calibrated_best"] is not None:  # null-calibrated (the default)
                cal, lift = entry["calibrated_best"], (entry.get("best_lift") or {}).get("value")
                shown = "none calibrated" if cal.get("value") is None else f"{cal['value']:.3f} ({cal.get('score')})"
                return shown + ("" if lift is None else f", lift {lift:+.3f}")
            e = entry.get("best") or {}
            return "n/a" if e.get("value") is None else f"{e['value']:.3f} ({e.get('score')})"

        attack = (
            _change(
                att.get("success_at_n_unlearned"), att.get("success_at_n_relearned"), att.get("persons"),
                (att.get("ci") or {}).get("success_at_n_unlearned"), (att.get("ci") or {}).get("success_at_n_relearned"),
            )
            if att else "n/a"
        )  # fmt: skip
        regime = m.get("regime") or {}
        label = regime.get("regime", "n/a")
        if regime.get("recovery_ratio") is not None:
            source = f", from {regime['source']}" if regime.get("source") else ""
            label += f" (ρ={regime['recovery_ratio']:.2f}{source})"
        if disagrees(m):
            label += " †"
            footnote = True
        frag = m.get("frag")
        lines.append(
            f"| {name} | {memorization(beh)} | {_relearned(beh, rel, 'forget_leak')} | {_relearned(beh, rel, 'retain_accuracy')} "
            f"| {_rate(beh, 'retain_eval_accuracy')} | {_rate(beh, 'crossfield_accuracy')} | {_ppl_ratio(beh)} "
            f"| {_rate(beh, 'j_w')} | {best('forget')} | {best('unified')} | {best('forget_vs_retain')} "
            f"| {'n/a' if frag is None else f'{frag:.3g}'} | {attack} | {label} |"
        )
    control = entry.get("positive_control")
    if control:
        regime = control.get("regime") or {}
        label = regime.get("regime", "n/a")
        if regime.get("recovery_ratio") is not None:
            label += f" (ρ={regime['recovery_ratio']:.2f}, from {regime.get('source', '?')})"
        beh = control.get("behaviour") or {}
        lines.append(
            f"| positive control: {control.get('name')} | {memorization(beh)} | {_rate(beh, 'forget_leak')} "
            f"| {_rate(beh, 'retain_accuracy')} | {_rate(beh, 'retain_eval_accuracy')} "
            f"| {_rate(beh, 'crossfield_accuracy')} | {_ppl_ratio(beh)} | {_rate(beh, 'j_w')} | | | | | | {label} |"
        )
    if trivial:
        cells = []
        for target in ("forget", "unified", "forget_vs_retain"):
            t = trivial.get(target) or {}
            cells.append(
                " / ".join(f"{t[k]:.3f}" for k in ("before_magnitude", "injection_magnitude") if t.get(k) is not None)
            )
        lines.append(f"| trivial detector (abs before / abs injection) | | | | | | | {' | '.join(cells)} | | | |")
    return lines, footnote


#: Columns of the across-seeds table: (header, dotted metric path in ``across_seeds.metrics``).
SEED_COLUMNS = (
    ("forget leak", "behaviour.forget_leak"),
    ("retain acc", "behaviour.retain_accuracy"),
    ("held-out retain acc", "behaviour.retain_eval_accuracy"),
    ("cross-field acc", "behaviour.crossfield_accuracy"),
    ("neutral ppl ratio", "behaviour.neutral_ppl_ratio"),
    ("J_W", "behaviour.j_w"),
    ("forget EM", "behaviour.em"),
    ("AUC(F) calibrated", "auc.forget.calibrated_best"),
    ("AUC(F) lift", "auc.forget.best_lift"),
    ("AUC(F) raw", "auc.forget.raw"),
    ("AUC(F vs R) best", "auc.forget_vs_retain.best"),
    ("FRAG", "frag"),
    ("Success@N relearned", "attack.success_at_n_relearned"),
)


def _mean_sd(cell: Any) -> str:
    if not isinstance(cell, dict) or cell.get("mean") is None:
        return "n/a"
    sd = cell.get("sd")
    return f"{cell['mean']:.3f}" + ("" if sd is None else f" ± {sd:.3f}")


def _seed_table(entry: dict[str, Any]) -> list[str]:
    """Mean ± sd over unlearning seeds per method (``lacuna run --seeds``); empty when one seed ran."""
    methods = {n: m["across_seeds"] for n, m in (entry.get("methods") or {}).items() if m.get("across_seeds")}
    if not methods:
        return []
    seeds = next(iter(methods.values())).get("seeds", [])
    lines = [
        f"Mean ± sd over {len(seeds)} unlearning seeds ({', '.join(map(str, seeds))}); the table above shows seed "
        f"{seeds[0] if seeds else '?'}.",
        "",
        "| method | " + " | ".join(h for h, _ in SEED_COLUMNS) + " | regime per seed |",
        "|---|" + "---|" * (len(SEED_COLUMNS) + 1),
    ]
    for name, summary in methods.items():
        metrics = summary.get("metrics") or {}
        regimes = " / ".join(str(r) for r in summary.get("regimes") or []) or "n/a"
        lines.append(f"| {name} | " + " | ".join(_mean_sd(metrics.get(p)) for _, p in SEED_COLUMNS) + f" | {regimes} |")
    return [*lines, ""]


def _matched_table(entry: dict[str, Any]) -> list[str]:
    """Each gradient method at matched forgetting (first snapshot with forget leak <= the threshold) and at the end
    of its schedule (empty when no method kept a trajectory)."""
    curves = {n: m["trajectory"] for n, m in (entry.get("methods") or {}).items() if m.get("trajectory")}
    if not curves:
        return []
    threshold = next(iter(curves.values())).get("leak_threshold")

    def cells(point: dict[str, Any] | None) -> str:
        if not point:
            return "not reached | |"
        held_out = point.get("retain_eval_accuracy")
        retain = f"{_pct(held_out)} (held-out)" if held_out is not None else _pct(point.get("retain_accuracy"))
        auc = (point.get("auc_raw") or {}).get("forget")
        return f"step {point['step']}: leak {_pct(point.get('forget_leak'))} | {retain} | {_fmt(auc, 3)}"

    lines = [
        f"Matched forgetting: each gradient method at the first checkpoint whose forget leak is ≤ {threshold}, and at "
        "the end of its schedule (plots/tradeoff.png).",
        "",
        "| method | matched: step, forget leak | retain acc | AUC(F) raw | end: step, forget leak | retain acc | AUC(F) raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, traj in curves.items():
        lines.append(f"| {name} | {cells(traj.get('matched'))} | {cells(traj.get('end'))} |")
    return [*lines, ""]


def _control_note(entry: dict[str, Any]) -> list[str]:
    """One line on whether the reversibility protocol passed its positive control (empty without one)."""
    control = entry.get("positive_control")
    if not control:
        return []
    rev = control.get("reversibility") or {}
    setting = f"lr {rev.get('learning_rate')}, {rev.get('epochs')} epochs, |D_f| rows from {', '.join(rev.get('sources') or [])}"
    if control.get("attack_strong_enough"):
        return [f"Positive control passed: output suppression alone comes out reversible under restricted relearning "
                f"({setting}), so the protocol can tell suppression from erasure.", ""]  # fmt: skip
    return [f"**Positive control failed**: {control.get('reason', 'see results.json')} ({setting}). Regimes are "
            "reported as `undetermined`; raise `reversibility.learning_rate` or `reversibility.epochs`.", ""]  # fmt: skip


def run_markdown(results: dict[str, Any]) -> str:
    """The LACUNA-style table of a ``lacuna run`` per field: one row per method, the model before unlearning, the
    trivial magnitude detector; then one legend line per column."""
    fields = _fields(results)
    names = ", ".join(f"`{f}`" for f in fields)
    lines = [f"# lacuna run: {results.get('preset', '?')} testbed, field{'s' if len(fields) > 1 else ''} {names}", ""]
    trivial = (results.get("baseline") or {}).get("auc")
    trivial = trivial if isinstance(trivial, dict) else {}
    every = [m for e in fields.values() for m in (e.get("methods") or {}).values()]
    attempts = next((m["attack"]["attempts"] for m in every if m.get("attack")), "N")
    regime_cfg = next(((m.get("regime") or {}).get("thresholds") for m in every if m.get("regime")), None) or {}
    tau_rev, tau_cat = regime_cfg.get("tau_rev", "tau_rev"), regime_cfg.get("tau_cat", "tau_cat")
    footnote = False
    for field, entry in fields.items():
        if len(fields) > 1:
            lines += [f"## Field `{field}`", ""]
        table, marked = _field_table(entry, trivial, attempts)
        lines += [*table, "", *_control_note(entry), *_matched_table(entry), *_seed_table(entry)]
        footnote = footnote or marked
    if footnote:
        lines += [
            f"† The regime and Success@{attempts} point different ways. The regime reads only the QA forget leak (one "
            f"prompt per person) before unlearning, after unlearning and after relearning (reversible iff relearning "
            f"recovers ≥ tau_rev = {tau_rev} of the removed leak; catastrophic iff retain acc after unlearning drops by "
            f"more than tau_cat = {tau_cat}); Success@{attempts} is the extraction probe ({attempts} fresh prompts per "
            f'person), which finds facts the single QA prompt misses. "irreversible" with Success@{attempts} > 0 after '
            "relearning: the QA answer stayed gone, the fact did not.",
            "",
        ]
    lines += [
        "## Reading this table",
        "",
        "- **n**: persons behind a rate (the field's forget or retain people in the testbed's splits; Success@N: "
        "the attacked forget people); few persons make coarse rates (n=1 gives only 0 or 1).",
        "- **[low, high]**: 95% percentile bootstrap interval of the rate, resampling persons (never documents); "
        "[v, v] means the persons showed no spread, not certainty.",
        "- **forget EM / ES / Prob**: teacher-forced exact match, extraction strength and answer probability on the "
        "forget people's QA (lower = more forgotten).",
        "- **forget leak**: share of forget people whose answer the model generates to their QA prompt, unlearned → "
        "after the relearning attack (lower = forgotten).",
        "- **retain acc**: share of retain people still answered, unlearned → after relearning (higher = kept; "
        "compare with the first row).",
        "- **held-out retain acc**: share of retain-eval people (memorized like the retain people, in no unlearning "
        "input) still answered; the retain acc column's people are the ones the retain loss trains on.",
        "- **cross-field acc**: share of the forget people's other three fields still answered (a `field=email` run "
        "must keep their birth city).",
        "- **J_W**: share of forget people leaking under any of 15 paraphrases or in-context retain prompts (worst "
        "case; n/a when the evaluated tasks leave it out).",
        "- **AUC(F) / AUC(F-R) / AUC(F vs R)**: does the update's size single out the forget scalars (vs all others / "
        "forget + retain vs outside / vs retain only); 0.5 = chance, 1 = exactly; best scoring function in brackets, "
        "taken only over the families that null updates (noise that knows nothing of the masks) leave at 0.5 ± the "
        "tolerance; **lift** = the largest AUC − null AUC over every family (docs/scoring.md, 'Null calibration').",
        "- **trivial detector**: the same AUCs from |θ_before| / |θ_before − θ_base| with no unlearning at all; a "
        "method's AUC shows localization only where it beats this row.",
        "- **FRAG**: forget alignment − γ × retain alignment of the weight update (higher predicts forgetting that "
        "survives relearning, docs/definitions.md#frag-score).",
        f"- **Success@N**: share of forget people leaking in at least one of N = {attempts} fresh extraction prompts, "
        "unlearned → relearned (a jump = suppressed, not erased).",
        "- **regime** (docs/definitions.md#forgetting-regimes): from the QA forget leak, reversible iff relearning "
        f"recovers ≥ tau_rev = {tau_rev} of the removed leak (ρ: the share recovered); catastrophic iff retain acc "
        f"drops > tau_cat = {tau_cat}. "
        "With the reversibility protocol (the default), relearning is restricted to |D_f| rows from the forget, "
        "retain and unrelated sources and the source that recovers most decides (named after ρ); without it, the "
        "held-out relearning attack of the forget leak column.",
        "- **positive control**: a method that only hides the answer (a refusal objective on the last layer, which "
        "holds no fact); it must come out reversible, or the protocol is too weak and regimes read `undetermined`.",
    ]
    wall = (results.get("manifest") or {}).get("wall_seconds")
    if wall is not None:
        lines += ["", f"Wall time of this run (cached stages count 0): {wall:.0f} s."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- lacuna run: plots


def write_run_report(out_dir: str | os.PathLike[str], results: dict[str, Any]) -> list[Path]:
    """``report.md`` and ``plots/{auc,layers,relearning}.png`` of a ``lacuna run`` (all written atomically). A run
    over several fields writes the first field's plots under these names and the others' as ``auc-<field>.png``."""
    from lacuna_metrics.manifest import write_text

    out = Path(out_dir)
    written = [write_text(out / "report.md", run_markdown(results))]
    trivial = (results.get("baseline") or {}).get("auc")
    trivial = trivial if isinstance(trivial, dict) else {}
    for i, (field, entry) in enumerate(_fields(results).items()):
        suffix = "" if i == 0 else f"-{field}"
        written += write_field_plots(out / "plots", entry.get("methods") or {}, trivial, suffix=suffix, field=field)
    return written


def _auc_value(method: dict[str, Any], target: str) -> float:
    entry = ((method.get("auc") or {}).get(target) or {}).get("best") or {}
    return float("nan") if entry.get("value") is None else float(entry["value"])


def _axis_ranges(values: list[float]) -> list[tuple[float, float]]:
    """The y-range(s) that show ``values``: one zoomed range, or two (a broken axis, upper range first) when a wide
    gap separates a few high values from the cluster, so that the cluster is not squashed."""
    vals = sorted({round(v, 6) for v in values if v == v})
    if not vals:
        return [(0.0, 1.0)]

    def padded(lo: float, hi: float) -> tuple[float, float]:
        pad = max(0.01, 0.12 * (hi - lo))
        return lo - pad, hi + 2.2 * pad  # room above the bars for their labels

    gaps = [(b - a, i) for i, (a, b) in enumerate(zip(vals, vals[1:], strict=False))]
    if gaps:
        gap, i = max(gaps)
        low, high = vals[: i + 1], vals[i + 1 :]
        if gap > 0.12 and gap > 2 * ((low[-1] - low[0]) + (high[-1] - high[0])):
            return [padded(high[0], high[-1]), padded(low[0], low[-1])]
    return [padded(vals[0], vals[-1])]


def write_field_plots(
    plots: Path, methods: dict[str, Any], trivial: dict[str, Any], *, suffix: str = "", field: str | None = None
) -> list[Path]:
    """``auc.png``, ``layers.png`` and ``relearning.png`` of one field's methods (each only if it has data)."""
    plt = _pyplot()
    import numpy as np

    written: list[Path] = []
    names = list(methods)
    where = f"field {field}" if field else ""
    targets = (("forget", "AUC(F)"), ("forget_vs_retain", "AUC(F vs R)"))
    if names and any(methods[n].get("auc") for n in names):
        values = {t: [_auc_value(methods[n], t) for n in names] for t, _ in targets}
        lines = {t: (trivial.get(t) or {}).get("before_magnitude") for t, _ in targets}
        ranges = _axis_ranges([0.5, *(v for vs in values.values() for v in vs), *(v for v in lines.values() if v)])
        heights = [1, 3] if len(ranges) == 2 else [1]
        fig, axes = plt.subplots(
            len(ranges), 1, sharex=True, figsize=(max(10.0, 1.3 * len(names) + 3.5), 5.8), layout="constrained",
            gridspec_kw={"height_ratios": heights}, squeeze=False,
        )  # fmt: skip
        fig.get_layout_engine().set(h_pad=0.02, hspace=0.0)
        axes = axes[:, 0]
        x = np.arange(len(names))
        width = 0.38
        colors = ("tab:blue", "tab:orange")
        for ax, (lo, hi) in zip(axes, ranges, strict=True):
            for k, ((target, label), color) in enumerate(zip(targets, colors, strict=True)):
                pos = x + (k - 0.5) * width
                vals = np.array(values[target])
                ax.bar(pos, vals - 0.5, width, bottom=0.5, color=color, label=label)
                for px, v in zip(pos, vals, strict=True):
                    if v == v and lo <= v <= hi:
                        ax.annotate(
                            f"{v:.3f}", (px, v), xytext=(0, 3 if v >= 0.5 else -3), textcoords="offset points",
                            ha="center", va="bottom" if v >= 0.5 else "top", fontsize=8,
                        )  # fmt: skip
                if lines[target] is not None:
                    ax.axhline(
                        lines[target], color=color, ls="--", lw=1.2,
                        label=f"trivial detector |θ_before|, {label} = {lines[target]:.3f}",
                    )  # fmt: skip
            ax.axhline(0.5, color="black", lw=1, label="chance 0.5")
            ax.set_ylim(lo, hi)
            ax.grid(axis="y", alpha=0.3)
            ax.tick_params(labelsize=9)
        if len(axes) == 2:  # the broken-axis marks
            axes[0].spines["bottom"].set_visible(False)
            axes[1].spines["top"].set_visible(False)
            axes[0].tick_params(bottom=False)
            mark = {"marker": [(-1, -0.5), (1, 0.5)], "markersize": 10, "linestyle": "none", "color": "k",
                    "mec": "k", "mew": 1, "clip_on": False}  # fmt: skip
            axes[0].plot([0, 1], [0, 0], transform=axes[0].transAxes, **mark)
            axes[1].plot([0, 1], [1, 1], transform=axes[1].transAxes, **mark)
        axes[-1].set_xticks(x, names, rotation=20, fontsize=10)
        fig.supylabel("ROC-AUC (best scoring function)", fontsize=10)
        axes[0].set_title("Localization: did the update land on the forget scalars?" + (f"\n{where}" if where else ""),
                          fontsize=12)  # fmt: skip
        handles, labels = axes[-1].get_legend_handles_labels()
        order = sorted(
            range(len(labels)), key=lambda i: (not labels[i].startswith("AUC"), labels[i].startswith("triv"))
        )
        handles, labels = [handles[i] for i in order], [labels[i] for i in order]
        fig.legend(handles, labels, fontsize=9, loc="outside lower center", ncols=2, frameon=False)
        written.append(save_figure(fig, plots / f"auc{suffix}.png"))

    layered = [n for n in names if methods[n].get("per_layer")]
    if layered:
        keys = sorted({(r["layer"], r["component"]) for n in layered for r in methods[n]["per_layer"]})
        mass = np.full((len(layered), len(keys)), np.nan)
        auc = np.full_like(mass, np.nan)
        for i, n in enumerate(layered):
            for r in methods[n]["per_layer"]:
                j = keys.index((r["layer"], r["component"]))
                m = (r.get("update_mass") or {}).get("forget")
                a = (r.get("auc") or {}).get("forget")
                mass[i, j] = np.nan if m is None else m
                auc[i, j] = np.nan if a is None or m is None else a  # no update: no AUC to read either
        short = {"attention": "attn"}
        cols = [f"L{layer}\n{short.get(component, component)}" for layer, component in keys]
        width = max(4.5, 0.62 * len(keys) + 2.2)
        fig, axes = plt.subplots(1, 2, figsize=(2 * width, max(3.8, 2.0 + 0.42 * len(layered))), layout="constrained")
        _heatmap(axes[0], mass, layered, cols, "viridis", label="share of update on forget scalars")
        axes[0].set_title("share of the update's squared mass on forget scalars", fontsize=11)
        _heatmap(axes[1], auc, layered, cols, "RdBu_r", label="AUC(F) in the layer (0.5 = chance)")
        axes[1].set_title("AUC(F) per layer and component", fontsize=11)
        fig.suptitle("Where each method's update went, per layer L and component" + (f" ({where})" if where else ""),
                     fontsize=12)  # fmt: skip
        fig.supxlabel("grey: the method left this layer and component unchanged", fontsize=9, color="#555555")
        written.append(save_figure(fig, plots / f"layers{suffix}.png"))

    attacked = [n for n in names if methods[n].get("attack")]
    if attacked:
        first = methods[attacked[0]]["attack"]
        persons = {methods[n]["attack"].get("persons") for n in attacked} - {None}
        count = persons.pop() if len(persons) == 1 else None
        n_text = "" if count is None else f"n={count} forget person{'' if count == 1 else 's'}"
        fig, ax = plt.subplots(figsize=(max(10.0, 1.3 * len(attacked) + 3.5), 5.0), layout="constrained")
        x = np.arange(len(attacked))
        width = 0.38
        for k, (key, label, color) in enumerate(
            (("success_at_n_unlearned", "unlearned", "tab:blue"), ("success_at_n_relearned", "after relearning", "tab:red"))
        ):  # fmt: skip
            pos = x + (k - 0.5) * width
            vals = [methods[n]["attack"].get(key) for n in attacked]
            heights = [np.nan if v is None else v for v in vals]
            ax.bar(pos, heights, width, color=color, label=f"Success@{first['attempts']}, {label}")
            for px, v in zip(pos, vals, strict=True):
                ax.annotate("n/a" if v is None else f"{v:.2f}", (px, 0 if v is None else v), xytext=(0, 6),
                            textcoords="offset points", ha="center", va="bottom", fontsize=9)  # fmt: skip
                if v == 0:  # a zero bar is a visible tick at 0, not missing data
                    ax.plot([px - width / 2, px + width / 2], [0, 0], color=color, lw=3, solid_capstyle="butt")
        leak = [(methods[n].get("relearned_behaviour") or {}).get("forget_leak") for n in attacked]
        if any(v is not None for v in leak):
            ax.scatter(
                x + 0.5 * width, [np.nan if v is None else v for v in leak], marker="D", s=28, color="black",
                zorder=5, label="QA forget leak after relearning (the regime's input)",
            )  # fmt: skip
        ax.set_xticks(x, attacked, rotation=20, fontsize=10)
        ax.set_ylim(-0.02, 1.15)
        ax.set_ylabel(f"Success@{first['attempts']} (share of forget people)", fontsize=10)
        title = f"Extraction Success@{first['attempts']}: unlearned → after the relearning attack"
        ax.set_title(title + "\n" + ", ".join(t for t in (n_text, where) if t), fontsize=12)
        ax.grid(axis="y", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("QA"))  # the bars first
        fig.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=9, loc="outside lower center",
                   ncols=3, frameon=False)  # fmt: skip
        written.append(save_figure(fig, plots / f"relearning{suffix}.png"))
    curves = {n: m["trajectory"] for n, m in methods.items() if (m.get("trajectory") or {}).get("points")}
    if curves:
        fig, (left, right) = plt.subplots(1, 2, figsize=(13.0, 5.2), layout="constrained")
        for name, traj in curves.items():
            points = traj["points"]
            retain_key = (
                "retain_eval_accuracy" if points[0].get("retain_eval_accuracy") is not None else "retain_accuracy"
            )
            xs = [p["forget_leak"] for p in points]
            ys = [p[retain_key] for p in points]
            (line,) = left.plot(xs, ys, marker="o", label=name)
            if traj.get("matched"):
                m = traj["matched"]
                left.plot([m["forget_leak"]], [m[retain_key]], marker="*", markersize=16, color=line.get_color())
            right.plot([p["step"] for p in points], [p["auc_raw"].get("forget") for p in points], marker="o",
                       color=line.get_color(), label=name)  # fmt: skip
        threshold = next(iter(curves.values())).get("leak_threshold")
        left.axvline(threshold, color="gray", linestyle=":", label=f"leak threshold {threshold}")
        left.set_xlabel("forget leak (lower = more forgotten)", fontsize=10)
        left.set_ylabel("retain accuracy (held-out people where the testbed has them)", fontsize=10)
        left.set_title("Trade-off along each schedule (★ = first point at the leak threshold)", fontsize=11)
        left.set_xlim(-0.05, 1.05)
        left.set_ylim(-0.05, 1.05)
        right.axhline(0.5, color="gray", linestyle=":", label="chance")
        right.set_xlabel("optimizer step", fontsize=10)
        right.set_ylabel("AUC(F), raw |δ|", fontsize=10)
        right.set_title("Localization along the schedule", fontsize=11)
        for ax in (left, right):
            ax.grid(alpha=0.3)
        left.legend(fontsize=8, loc="lower left")
        fig.suptitle(f"Matched forgetting{', ' + where if where else ''}", fontsize=12)
        written.append(save_figure(fig, plots / f"tradeoff{suffix}.png"))
    return written
