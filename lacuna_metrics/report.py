"""Human views of a score JSON: a markdown summary and, on request, ROC curves and a layer heatmap."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lacuna_metrics.auc import TARGETS
from lacuna_metrics.manifest import save_figure

__all__ = ["markdown_summary", "write_plots"]


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_summary(result: dict[str, Any]) -> str:
    """The score JSON as markdown tables: AUCs per score and target, baselines, FRAG, distance, layers."""
    inputs = result["manifest"]["inputs"]
    lines = [f"# lacuna score: `{inputs['after']['path']}`", "", f"before: `{inputs['before']['path']}`"]
    if "base" in inputs:
        lines.append(f"base (reversal reference): `{inputs['base']['path']}`")
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
        lines += [
            "",
            "All AUCs exact (ties count ½)."
            if worst == 0
            else f"Largest AUC error bound: {worst:.2e} (histogram mode).",
        ]
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
