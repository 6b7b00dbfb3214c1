"""The figures of a score: ROC curves and layer heatmaps (``roc.png``, ``layers.png``); docs/report.md. The
pyplot loader and the heatmap are shared with the run report's plots (:mod:`lacuna_unlearn.bench.report.plots`).
Every figure is written atomically by :func:`lacuna_metrics.manifest.save_figure`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.manifest import save_figure

__all__ = ["PLOT_FILES", "heatmap", "pyplot", "roc_series", "write_plots"]

#: The files :func:`write_plots` writes (a score without ``--plots`` removes an earlier score's).
PLOT_FILES = ("roc.png", "layers.png")


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


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: dict[str, Any], out_dir: str | os.PathLike[str], top: int = 3) -> list[Path]:
    """Write ``roc.png`` (per target: the best score's curve, the next ``top`` scores and the baselines) and
    ``layers.png`` (per layer and component: AUC and share of the update inside the forget masks)."""
    plt = pyplot()
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
        written.append(save_figure(fig, out / PLOT_FILES[0]))
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
            heatmap(ax, data, [str(v) for v in layers], comps, cmap, label=title)
            ax.set_title(title, fontsize=11)
            ax.set_ylabel("layer", fontsize=10)
        fig.supxlabel("grey: the update left this layer and component unchanged", fontsize=9, color="#555555")
        written.append(save_figure(fig, out / PLOT_FILES[1]))
    return written


def heatmap(ax, data, rows: list[str], cols: list[str], cmap: str, *, label: str, digits: int = 2) -> Any:
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
