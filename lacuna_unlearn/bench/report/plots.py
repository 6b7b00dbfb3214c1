"""The plots of a ``lacuna run`` report (``plots/*.png``): per field, AUC per method, update location per layer,
relearning and the forget/retain trade-off along each schedule (docs/report.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lacuna_metrics import heatmap, pyplot, save_figure
from lacuna_unlearn.bench.report.tables import attack_label

__all__ = ["write_field_plots"]


def _auc_value(method: dict[str, Any], target: str) -> float:
    """The calibrated best AUC of ``target`` (NaN: no family passed the null calibration). Results written before
    the calibration existed have only the uncalibrated best, which is plotted then."""
    entry = (method.get("auc") or {}).get(target) or {}
    best = entry.get("calibrated_best") if "calibrated_best" in entry else entry.get("best")
    return float("nan") if not best or best.get("value") is None else float(best["value"])


def _null_band(method: dict[str, Any], target: str) -> tuple[float, float] | None:
    """The verdict's null as (low, high): its mean AUC ± 2 spreads."""
    null = (((method.get("auc") or {}).get(target) or {}).get("null")) or {}
    if null.get("auc") is None:
        return None
    sd = float(null.get("sd") or 0.0)
    return float(null["auc"]) - 2 * sd, float(null["auc"]) + 2 * sd


def _family_values(method: dict[str, Any], target: str) -> list[float]:
    """Every family's uncalibrated AUC of ``target``."""
    families = (((method.get("auc") or {}).get(target) or {}).get("families")) or {}
    return [float(v) for v in families.values() if isinstance(v, (int, float))]


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


def _restricted_leak(method: dict[str, Any]) -> tuple[float | None, str | None]:
    """The QA forget leak after restricted relearning from the source the regime was read from, and that source
    (None, None without the reversibility protocol)."""
    rev = method.get("reversibility") or {}
    sources = rev.get("sources") or {}
    source = (rev.get("regime") or {}).get("source") or (method.get("regime") or {}).get("source")
    if source not in sources:
        return None, None
    return sources[source].get("forget_leak"), source


def _regime_from_heldout(method: dict[str, Any]) -> bool:
    """Whether the method's regime was read from the held-out relearning attack (no reversibility protocol)."""
    return not method.get("reversibility") and bool(method.get("regime"))


def _relearning_plot(plt: Any, np: Any, path: Path, methods: dict[str, Any], names: list[str], where: str) -> Path:
    """``relearning.png``: per method, Success@N unlearned and after the held-out relearning attack (bars), the QA
    forget leak after that attack (diamonds) and after the restricted relearning the regime is read from
    (triangles, with its source). Each mark names its relearning: they are different attacks on different rows."""
    attacked = [n for n in names if methods[n].get("attack")]
    first = methods[attacked[0]]["attack"] if attacked else {}
    attempts = first.get("attempts", "N")
    attack = attack_label(methods[n] for n in names)  # attack=relearn: LACUNA's, on held-out memorized people
    persons = {methods[n]["attack"].get("persons") for n in attacked} - {None}
    count = persons.pop() if len(persons) == 1 else None
    n_text = "" if count is None else f"n={count} forget person{'' if count == 1 else 's'}"
    fig, ax = plt.subplots(figsize=(max(10.0, 1.3 * len(names) + 3.5), 5.2), layout="constrained")
    x = np.arange(len(names))
    width = 0.38
    if attacked:
        for k, (key, label, color) in enumerate(
            (("success_at_n_unlearned", "unlearned", "tab:blue"), ("success_at_n_relearned", f"after {attack}",
                                                                   "tab:red"))
        ):  # fmt: skip
            pos = x + (k - 0.5) * width
            vals = [(methods[n].get("attack") or {}).get(key) for n in names]
            heights = [np.nan if v is None else v for v in vals]
            ax.bar(pos, heights, width, color=color, label=f"Success@{attempts}, {label}")
            for px, v in zip(pos, vals, strict=True):
                ax.annotate("n/a" if v is None else f"{v:.2f}", (px, 0 if v is None else v), xytext=(0, 6),
                            textcoords="offset points", ha="center", va="bottom", fontsize=9)  # fmt: skip
                if v == 0:  # a zero bar is a visible tick at 0, not missing data
                    ax.plot([px - width / 2, px + width / 2], [0, 0], color=color, lw=3, solid_capstyle="butt")
    leak = [(methods[n].get("relearned_behaviour") or {}).get("forget_leak") for n in names]
    if any(v is not None for v in leak):
        regime_input = all(_regime_from_heldout(methods[n]) for n, v in zip(names, leak, strict=True) if v is not None)
        ax.scatter(
            x + 0.5 * width, [np.nan if v is None else v for v in leak], marker="D", s=28, color="black", zorder=5,
            label=f"QA forget leak after {attack}" + (" (the regime's input)" if regime_input else ""),
        )  # fmt: skip
    restricted = [_restricted_leak(methods[n]) for n in names]
    if any(v is not None for v, _ in restricted):
        ax.scatter(
            x + width + 0.07, [np.nan if v is None else v for v, _ in restricted], marker="^", s=46,
            color="tab:purple", edgecolors="black", linewidths=0.5, zorder=6,
            label="QA forget leak after restricted relearning, from the source the regime is read from (the "
            "regime's input)",
        )  # fmt: skip
        for px, (v, source) in zip(x + width + 0.07, restricted, strict=True):
            if v is not None:
                ax.annotate(source, (px, v), xytext=(4, 2), textcoords="offset points", ha="left", va="bottom",
                            fontsize=8, color="tab:purple")  # fmt: skip
    ax.set_xticks(x, names, rotation=20, fontsize=10)
    ax.set_ylim(-0.02, 1.15)
    ax.set_ylabel("share of forget people", fontsize=10)
    title = (
        f"Extraction Success@{attempts}: unlearned → after {attack}" if attacked else "QA forget leak after relearning"
    )
    ax.set_title(title + "\n" + ", ".join(t for t in (n_text, where) if t), fontsize=12)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("QA"))  # the bars first
    fig.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=9, loc="outside lower center",
               ncols=2, frameon=False)  # fmt: skip
    return save_figure(fig, path)


def write_field_plots(
    plots: Path, methods: dict[str, Any], trivial: dict[str, Any], *, suffix: str = "", field: str | None = None
) -> list[Path]:
    """``auc.png``, ``layers.png`` and ``relearning.png`` of one field's methods (each only if it has data)."""
    plt = pyplot()
    import numpy as np

    written: list[Path] = []
    names = list(methods)
    where = f"field {field}" if field else ""
    targets = (("forget", "AUC(F)"), ("forget_vs_retain", "AUC(F vs R)"))
    if names and any(methods[n].get("auc") for n in names):
        values = {t: [_auc_value(methods[n], t) for n in names] for t, _ in targets}
        bands = {t: [_null_band(methods[n], t) for n in names] for t, _ in targets}
        families = {t: [_family_values(methods[n], t) for n in names] for t, _ in targets}
        lines = {t: (trivial.get(t) or {}).get("before_magnitude") for t, _ in targets}
        shown = [*(v for vs in values.values() for v in vs), *(v for v in lines.values() if v)]
        shown += [x for bs in bands.values() for b in bs if b is not None for x in b]
        shown += [x for fs in families.values() for f in fs for x in f]
        ranges = _axis_ranges([0.5, *shown])
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
                ax.bar(pos, vals - 0.5, width, bottom=0.5, color=color, label=f"{label}, calibrated best")
                for i, (px, v) in enumerate(zip(pos, vals, strict=True)):
                    band = bands[target][i]
                    if band is not None:  # the verdict's null: mean ± 2 spreads of the method-free updates
                        ax.fill_between([px - width / 2, px + width / 2], *band, color="0.35", alpha=0.45, lw=0,
                                        label="null updates at the method's scale (mean ± 2 sd)", zorder=3)  # fmt: skip
                    marks = [m for m in families[target][i] if lo <= m <= hi]
                    ax.scatter([px] * len(marks), marks, marker="_", s=90, lw=0.8, color="black", zorder=4,
                               label="each family's uncalibrated AUC")  # fmt: skip
                    if v == v and lo <= v <= hi:
                        ax.annotate(
                            f"{v:.3f}", (px, v), xytext=(0, 3 if v >= 0.5 else -3), textcoords="offset points",
                            ha="center", va="bottom" if v >= 0.5 else "top", fontsize=8,
                        )  # fmt: skip
                    elif v != v:
                        ax.annotate("no\nverdict", (px, 0.5), xytext=(0, 3), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=7, color=color)  # fmt: skip
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
        fig.supylabel("ROC-AUC (calibrated best scoring function)", fontsize=10)
        axes[0].set_title("Localization: did the update land on the forget scalars?" + (f"\n{where}" if where else ""),
                          fontsize=12)  # fmt: skip
        handles, labels = axes[-1].get_legend_handles_labels()
        unique = {lab: h for h, lab in zip(handles, labels, strict=True)}  # one entry per label (bands repeat)
        labels = sorted(unique, key=lambda lab: (not lab.startswith("AUC"), lab.startswith("triv")))
        handles = [unique[lab] for lab in labels]
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
        heatmap(axes[0], mass, layered, cols, "viridis", label="share of update on forget scalars")
        axes[0].set_title("share of the update's squared mass on forget scalars", fontsize=11)
        heatmap(axes[1], auc, layered, cols, "RdBu_r", label="AUC(F) in the layer (0.5 = chance)")
        axes[1].set_title("AUC(F) per layer and component", fontsize=11)
        fig.suptitle("Where each method's update went, per layer L and component" + (f" ({where})" if where else ""),
                     fontsize=12)  # fmt: skip
        fig.supxlabel("grey: the method left this layer and component unchanged", fontsize=9, color="#555555")
        written.append(save_figure(fig, plots / f"layers{suffix}.png"))

    relearned = [n for n in names if methods[n].get("attack") or _restricted_leak(methods[n])[0] is not None]
    if relearned:
        written.append(_relearning_plot(plt, np, plots / f"relearning{suffix}.png", methods, relearned, where))
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
