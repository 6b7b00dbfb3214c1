"""Human views of results: a score JSON (markdown, ROC curves, layer heatmap) and a ``lacuna run`` results JSON
(the LACUNA-style table, "reading this table", AUC / update-location / relearning plots)."""

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


def write_plots(result: dict[str, Any], out_dir: str | os.PathLike[str], top: int = 3) -> list[Path]:
    """Write ``roc.png`` (best scores and baselines, per target) and ``layers.png`` (AUC and mass heatmaps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    roc = result.get("roc")
    if roc:
        fig, axes = plt.subplots(1, len(TARGETS), figsize=(5 * len(TARGETS), 4.5))
        for ax, target in zip(axes, TARGETS, strict=True):
            auc = result["auc"][target]
            ranked = sorted(
                (s for s, v in auc.items() if s not in ("best", "composite") and v is not None),
                key=lambda s: -auc[s],
            )[:top]
            for s in ranked:
                curve = roc[target][s]
                ax.plot(curve["fpr"], curve["tpr"], label=f"{s} ({auc[s]:.3f})")
            for b, v in result["baselines"][target].items():
                if v is not None and b in roc[target]:
                    curve = roc[target][b]
                    ax.plot(curve["fpr"], curve["tpr"], linestyle="--", label=f"baseline {b} ({v:.3f})")
            ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
            ax.set(title=target, xlabel="false positive rate", ylabel="true positive rate")
            ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        written.append(save_figure(fig, out / "roc.png"))
    per_layer = result.get("per_layer") or []
    if per_layer:
        layers = sorted({r["layer"] for r in per_layer})
        comps = sorted({r["component"] for r in per_layer})
        auc = np.full((len(layers), len(comps)), np.nan)
        inside = np.full_like(auc, np.nan)
        for r in per_layer:
            i, j = layers.index(r["layer"]), comps.index(r["component"])
            auc[i, j] = np.nan if r["auc"]["forget"] is None else r["auc"]["forget"]
            mass = r["update_mass"]
            inside[i, j] = np.nan if mass["forget"] is None else mass["forget"]
        fig, axes = plt.subplots(1, 2, figsize=(8, 1.5 + 0.45 * len(layers)))
        for ax, data, title in (
            (axes[0], auc, "AUC (forget)"),
            (axes[1], inside, "share of update mass in forget masks"),
        ):
            im = ax.imshow(data, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set(title=title, xticks=range(len(comps)), yticks=range(len(layers)), ylabel="layer")
            ax.set_xticklabels(comps)
            ax.set_yticklabels(layers)
            for (i, j), v in np.ndenumerate(data):
                if not np.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black")
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        written.append(save_figure(fig, out / "layers.png"))
    return written


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def run_markdown(results: dict[str, Any]) -> str:
    """The LACUNA-style table of a ``lacuna run``: one row per method, plus the trivial magnitude detector."""
    field = results.get("field", "?")
    lines = [
        f"# lacuna run: {results.get('preset', '?')} testbed, field `{field}`",
        "",
        "| method | forget EM | forget ES | forget Prob | forget leak | retain acc | J_W | AUC(F) | AUC(F-R) "
        "| AUC(F vs R) | FRAG | Success@N unlearned -> relearned | regime |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = results.get("baseline") or {}
    b = base.get("behaviour") or {}
    lines.append(
        f"| before unlearning | {_pct(b.get('em'))} | {_pct(b.get('es'))} | {_pct(b.get('prob'))} "
        f"| {_pct(b.get('forget_leak'))} | {_pct(b.get('retain_accuracy'))} | {_pct(b.get('j_w'))} "
        "| | | | | | |"
    )
    for name, m in (results.get("methods") or {}).items():
        beh, auc, att = m.get("behaviour") or {}, m.get("auc") or {}, m.get("attack") or {}

        def best(target: str, auc: dict = auc) -> str:
            entry = (auc.get(target) or {}).get("best") or {}
            return "n/a" if entry.get("value") is None else f"{entry['value']:.3f} ({entry.get('score')})"

        attack = (
            f"{_pct(att.get('success_at_n_unlearned'))} -> {_pct(att.get('success_at_n_relearned'))}" if att else "n/a"
        )
        frag = m.get("frag")
        lines.append(
            f"| {name} | {_pct(beh.get('em'))} | {_pct(beh.get('es'))} | {_pct(beh.get('prob'))} "
            f"| {_pct(beh.get('forget_leak'))} | {_pct(beh.get('retain_accuracy'))} | {_pct(beh.get('j_w'))} "
            f"| {best('forget')} | {best('unified')} | {best('forget_vs_retain')} "
            f"| {'n/a' if frag is None else f'{frag:.3g}'} | {attack} | {(m.get('regime') or {}).get('regime', 'n/a')} |"
        )
    trivial = (base.get("auc") or {}) if isinstance(base.get("auc"), dict) else {}
    if trivial:
        cells = []
        for target in ("forget", "unified", "forget_vs_retain"):
            t = trivial.get(target) or {}
            cells.append(
                " / ".join(f"{t[k]:.3f}" for k in ("before_magnitude", "injection_magnitude") if t.get(k) is not None)
            )
        lines.append(f"| trivial detector (abs before / abs injection) | | | | | | | {' | '.join(cells)} | | | |")
    attempts = next((m["attack"]["attempts"] for m in (results.get("methods") or {}).values() if m.get("attack")), "N")
    lines += [
        "",
        "## Reading this table",
        "",
        "- **forget EM / ES / Prob, forget leak, J_W** (lower is better after unlearning): teacher-forced exact match,",
        "  extraction strength and probability of the forget answers; the share of forget people whose answer the",
        "  model still generates (QA probe); J_W, the worst case over 15 paraphrases and in-context retain prompts.",
        "- **retain acc**: share of retain people still answered (higher is better; compare with the first row).",
        "- **AUC(F)**: how well the size of each scalar's update (best of the LACUNA scoring functions) separates",
        "  the forget-group parameters from every other masked-layer parameter; **AUC(F-R)** the same with forget",
        "  and retain groups as positives (`unified`); **AUC(F vs R)** forget against retain groups only. 0.5 = the",
        "  update did not land on the facts any more than elsewhere; 1.0 = it landed exactly on them.",
        "- **trivial detector**: the same AUCs from |θ_before| and |θ_before − θ_base| alone, with no unlearning at",
        "  all. A method's AUC is only evidence of localization where it beats this row.",
        "- **FRAG**: forget alignment minus γ × retain alignment of the weight update (higher predicts more robust",
        "  forgetting under relearning, spec §3.3).",
        f"- **Success@N**: share of forget people leaking in at least one of N = {attempts} fresh extraction prompts,",
        "  on the unlearned model and after the relearning attack; a jump means the facts were suppressed, not erased.",
        "- **regime**: spec §5.7 (reversible iff relearning recovers at least tau_rev of the removed forget accuracy;",
        "  catastrophic iff retain accuracy dropped by more than tau_cat).",
    ]
    wall = (results.get("manifest") or {}).get("wall_seconds")
    if wall is not None:
        lines += ["", f"Wall time of this run (cached stages count 0): {wall:.0f} s."]
    return "\n".join(lines) + "\n"


def write_run_report(out_dir: str | os.PathLike[str], results: dict[str, Any]) -> list[Path]:
    """``report.md`` and ``plots/{auc,layers,relearning}.png`` of a ``lacuna run`` (all written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from lacuna_metrics.manifest import write_text

    out = Path(out_dir)
    written = [write_text(out / "report.md", run_markdown(results))]
    methods = results.get("methods") or {}
    names = list(methods)
    plots = out / "plots"

    def best(name: str, target: str) -> float:
        entry = ((methods[name].get("auc") or {}).get(target) or {}).get("best") or {}
        return float("nan") if entry.get("value") is None else float(entry["value"])

    if names and any(methods[n].get("auc") for n in names):
        fig, ax = plt.subplots(figsize=(1.2 * len(names) + 3, 4))
        x = np.arange(len(names))
        for i, (target, label) in enumerate((("forget", "AUC(F)"), ("forget_vs_retain", "AUC(F vs R)"))):
            ax.bar(x + (i - 0.5) * 0.38, [best(n, target) for n in names], 0.38, label=label)
        trivial = ((results.get("baseline") or {}).get("auc") or {}).get("forget") or {}
        if trivial.get("before_magnitude") is not None:
            ax.axhline(trivial["before_magnitude"], color="grey", ls="--", lw=1, label="trivial |θ_before| AUC(F)")
        ax.axhline(0.5, color="black", lw=0.6)
        ax.set_xticks(x, names, rotation=20)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("ROC-AUC (best scoring function)")
        ax.set_title("Did the update land on the forget parameters?")
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        written.append(save_figure(fig, plots / "auc.png"))

        layered = [n for n in names if methods[n].get("per_layer")]
        if layered:
            fig, axes = plt.subplots(1, len(layered), figsize=(2.2 * len(layered) + 1, 3), squeeze=False)
            for ax, name in zip(axes[0], layered, strict=True):
                rows = methods[name]["per_layer"]
                layers = sorted({r["layer"] for r in rows})
                comps = sorted({r["component"] for r in rows})
                grid = np.full((len(layers), len(comps)), np.nan)
                for r in rows:
                    mass = (r.get("update_mass") or {}).get("forget")
                    grid[layers.index(r["layer"]), comps.index(r["component"])] = np.nan if mass is None else mass
                image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
                ax.set_title(name, fontsize=9)
                ax.set_xticks(range(len(comps)), comps, fontsize=7)
                ax.set_yticks(range(len(layers)), [str(v) for v in layers], fontsize=7)
            axes[0][0].set_ylabel("layer")
            fig.colorbar(image, ax=axes[0].tolist(), label="share of update on forget scalars")
            written.append(save_figure(fig, plots / "layers.png"))

    attacked = [n for n in names if methods[n].get("attack")]
    if attacked:
        fig, ax = plt.subplots(figsize=(1.2 * len(attacked) + 3, 4))
        x = np.arange(len(attacked))
        for i, (key, label) in enumerate(
            (("success_at_n_unlearned", "unlearned"), ("success_at_n_relearned", "after relearning"))
        ):
            ax.bar(x + (i - 0.5) * 0.38, [methods[n]["attack"][key] for n in attacked], 0.38, label=label)
        ax.set_xticks(x, attacked, rotation=20)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"Success@{methods[attacked[0]]['attack']['attempts']}")
        ax.set_title("Forget leak before / after the relearning attack")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(save_figure(fig, plots / "relearning.png"))
    return written
