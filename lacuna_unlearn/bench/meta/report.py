"""``meta.md`` and the plots of ``lacuna meta`` (docs/meta.md): the ρ table (pooled and leave-one-method-out), the
noise controls' ranking, faithfulness, robustness; a predictor-vs-outcome scatter per predictor and a ranking chart
for the headline outcome."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.meta.pool import HEADLINE_OUTCOME

__all__ = ["meta_markdown", "write_meta_report"]


def _num(value: Any, digits: int = 2) -> str:
    return "n/a" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


def _rho_cell(cell: dict[str, Any]) -> str:
    if cell.get("rho") is None:
        return f"n/a (n={cell.get('n')})"
    mark = " †" if cell.get("underpowered") else ""
    return f"{cell['rho']:+.2f} [{_num(cell.get('low'))}, {_num(cell.get('high'))}] n={cell['n']}{mark}"


def _loo_cell(cell: dict[str, Any]) -> str:
    loo = cell.get("leave_one_method_out")
    if not loo:
        return "n/a"
    flips = f"; sign flips without {', '.join(loo['sign_flips'])}" if loo["sign_flips"] else ""
    return f"{loo['min']:+.2f}..{loo['max']:+.2f} (−{loo['most_influential']}: {loo['rho_without_it']:+.2f}){flips}"


def _noise_cell(cell: dict[str, Any]) -> str:
    noise = cell.get("noise_controls") or {}
    if noise.get("ranked_robust") is None:
        return "n/a"
    worst = max(noise["percentiles"])
    return ("**ranked robust**" if noise["ranked_robust"] else "not robust") + f" (top pct {worst:.2f})"


def ranking(meta: dict[str, Any], outcome: str = HEADLINE_OUTCOME) -> list[tuple[str, dict[str, Any]]]:
    """The predictors by |ρ| with ``outcome`` (undefined ρ last)."""
    cells = [(p, row[outcome]) for p, row in meta["correlation"].items() if outcome in row]
    return sorted(cells, key=lambda pc: -abs(pc[1]["rho"]) if pc[1].get("rho") is not None else 1.0)


def _predictor_table(
    meta: dict[str, Any], outcomes: list[str], cell: Callable[[dict[str, Any]], str], title: str, text: str
) -> list[str]:
    """A section: ``title``, ``text``, then one row per predictor with ``cell`` of each outcome's ρ entry."""
    lines = ["", title, "", text, "", "| predictor | " + " | ".join(outcomes) + " |", "|---|" + "---|" * len(outcomes)]
    for p, row in meta["correlation"].items():
        lines.append(f"| {p} | " + " | ".join(cell(row[o]) for o in outcomes if o in row) + " |")
    return lines


def meta_markdown(meta: dict[str, Any]) -> str:
    pool = meta["pool"]
    outcomes = list(meta["outcomes"])
    lines = [
        "# lacuna meta: which measurement predicts that forgetting lasts",
        "",
        f"Pool: {pool['models']} models ({len(pool['methods'])} methods incl. noise controls, fields "
        f"{', '.join(pool['fields'])}, seeds {', '.join(map(str, pool['seeds']))}); noise controls: "
        f"{len(pool['noise_controls'])}. Run: `{meta['run']}`.",
        "",
        "Spearman's ρ of each predictor with each outcome (higher outcome = the forgetting lasted less), with its "
        "95% bootstrap interval over models and n; † marks an underpowered cell (under 8 models or one method). "
        "Definitions: docs/meta.md.",
        "",
        "## ρ, pooled",
        "",
        "| predictor | " + " | ".join(outcomes) + " |",
        "|---|" + "---|" * len(outcomes),
    ]
    for p, row in meta["correlation"].items():
        lines.append(f"| {p} | " + " | ".join(_rho_cell(row[o]) for o in outcomes if o in row) + " |")
    headline = [o for o in outcomes if not o.startswith("delta_")]
    forgot = meta.get("correlation_forgot") or {}
    if forgot.get("rho"):
        lines += [
            "",
            f"## ρ among the models that forgot (forget leak ≤ {forgot['max_forget_leak']:g})",
            "",
            f"{forgot['models']} models ({forgot['noise_controls']} noise controls). Over the whole pool, a high "
            "leak after relearning also comes from models that never forgot; here it reads only what came back.",
            "",
            "| predictor | " + " | ".join(outcomes) + " |",
            "|---|" + "---|" * len(outcomes),
        ]
        for p, row in forgot["rho"].items():
            lines.append(f"| {p} | " + " | ".join(_rho_cell(row[o]) for o in outcomes if o in row) + " |")
    lines += _predictor_table(
        meta, headline, _loo_cell, "## Leave one method out (FRAG's circularity check)",
        "The range of ρ over the pools without each method in turn, and the method whose removal moves ρ most.",
    )  # fmt: skip
    top = meta["settings"]["top"]
    lines += _predictor_table(
        meta, headline, _noise_cell, "## Noise controls",
        f"Method-free updates at the pool's median L2 ({', '.join(pool['noise_controls']) or 'none'}). A predictor "
        f"fails when it places one in the top {top:.0%} of predicted robustness (its percentile shown; 1 = predicted "
        "most robust).",
    )  # fmt: skip
    faith = meta["faithfulness"]
    lines += [
        "",
        "## Faithfulness (OpenUnlearning's meta-evaluation)",
        "",
        f"AUC of each metric separating {faith['pools']['knows']} evaluations of models that know the facts "
        f"({faith['knows']}) from {faith['pools']['never_learned']} of models that never learned them "
        f"({faith['never_learned']}); 95% stratified bootstrap interval.",
        "",
        "| metric | AUC | interval | n knows / never |",
        "|---|---|---|---|",
    ]
    for m, cell in faith["metrics"].items():
        mark = " †" if cell.get("underpowered") else ""
        lines.append(
            f"| {m} | {_num(cell.get('auc'))}{mark} | [{_num(cell.get('low'))}, {_num(cell.get('high'))}] "
            f"| {cell['n_knows']} / {cell['n_never_learned']} |"
        )
    rob = meta["robustness"]
    bits = meta["settings"]["quantize_bits"]
    lines += [
        "",
        "## Robustness of the metrics (OpenUnlearning Eq. 2-4)",
        "",
        f"Over {rob['models']} models: R under restricted relearning from the forget rows against {rob['reference']}; "
        "Q under round-to-nearest quantization; HM(R, Q) at the narrowest width. Mean over models [95% bootstrap] "
        f"(n). Where a ratio is undefined: {rob['undefined']['relearning']}; {rob['undefined']['quantization']}.",
        "",
        "| metric | R (relearning) | " + " | ".join(f"Q ({b}-bit)" for b in bits) + " | HM |",
        "|---|---|" + "---|" * len(bits) + "---|",
    ]

    def mean_cell(c: dict[str, Any]) -> str:
        return f"{_num(c.get('mean'))} [{_num(c.get('low'))}, {_num(c.get('high'))}] (n={c['n']})"

    for m, entry in rob["metrics"].items():
        qs = " | ".join(mean_cell(entry[f"quantization_{b}bit"]) for b in bits)
        lines.append(f"| {m} | {mean_cell(entry['relearning'])} | {qs} | {_num(entry.get('aggregate'))} |")
    wall = (meta.get("manifest") or {}).get("wall_seconds")
    lines += ["", f"Wall time of `lacuna meta`: {wall} s (stages cached in the run's stage cache).", ""]
    return "\n".join(lines)


def _scatter(plt: Any, path: Path, meta: dict[str, Any], predictor: str, outcome: str) -> None:
    rows = meta["pool"]["rows"]
    cell = meta["correlation"][predictor][outcome]
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    methods = sorted({r["method"] for r in rows})
    cmap = plt.get_cmap("tab20")
    for i, method in enumerate(methods):
        pts = [
            (r["predictors"].get(predictor), r["outcomes"].get(outcome), r["noise"])
            for r in rows
            if r["method"] == method
        ]
        pts = [(x, y, n) for x, y, n in pts if x is not None and y is not None]
        if not pts:
            continue
        noise = pts[0][2]
        ax.scatter(
            [p[0] for p in pts], [p[1] for p in pts], label=method + (" (noise)" if noise else ""),
            marker="x" if noise else "o", color="black" if noise else cmap(i % 20), s=28, alpha=0.8,
        )  # fmt: skip
    xs = [r["predictors"].get(predictor) for r in rows]
    xs = [x for x in xs if isinstance(x, (int, float))]
    if xs and min(xs) > 0 and max(xs) / min(xs) > 100:  # L2 and its kin span decades: one method would flatten the rest
        ax.set_xscale("log")
    rho = (
        "n/a" if cell.get("rho") is None else f"{cell['rho']:+.2f} [{_num(cell.get('low'))}, {_num(cell.get('high'))}]"
    )
    ax.set_title(f"{predictor} vs {outcome}\nSpearman ρ = {rho}, n = {cell['n']}", fontsize=9)
    ax.set_xlabel(predictor)
    ax.set_ylabel(outcome)
    ax.legend(fontsize=6, loc="best", ncol=2)
    fig.tight_layout()
    from lacuna_metrics import save_figure

    save_figure(fig, path)


def write_meta_report(out: Path, meta: dict[str, Any]) -> list[Path]:
    """``meta.md``, ``plots/scatter_<predictor>.png`` for the headline outcome, and ``plots/ranking.png``."""
    from lacuna_metrics import pyplot, save_figure, write_text

    written = [write_text(out / "meta.md", meta_markdown(meta))]
    plt = pyplot()
    outcome = (meta.get("settings") or {}).get("headline") or HEADLINE_OUTCOME
    outcome = outcome if outcome in meta["outcomes"] else next(iter(meta["outcomes"]))
    for predictor in meta["correlation"]:
        path = out / "plots" / f"scatter_{predictor}.png"
        _scatter(plt, path, meta, predictor, outcome)
        written.append(path)
    ranked = ranking(meta, outcome)
    fig, ax = plt.subplots(figsize=(6.0, 0.35 * len(ranked) + 1.2))
    names = [p for p, _ in ranked][::-1]
    cells = [c for _, c in ranked][::-1]
    rhos = [c["rho"] if c.get("rho") is not None else 0.0 for c in cells]
    # a percentile bootstrap interval need not contain ρ itself (a skewed pool): the bar is clipped at ρ
    lows = [max(r - c["low"], 0.0) if c.get("low") is not None else 0.0 for r, c in zip(rhos, cells, strict=True)]
    highs = [max(c["high"] - r, 0.0) if c.get("high") is not None else 0.0 for r, c in zip(rhos, cells, strict=True)]
    colors = ["tab:red" if (c.get("noise_controls") or {}).get("ranked_robust") else "tab:blue" for c in cells]
    ax.barh(names, rhos, xerr=[lows, highs], color=colors, alpha=0.8, capsize=3)
    for i, c in enumerate(cells):
        if c.get("rho") is None:  # undefined (no pairs, or a constant side): said, not drawn as a zero
            ax.text(0.02, i, f"n/a (n={c.get('n')})", va="center", fontsize=7, color="gray")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlim(-1, 1)
    ax.set_xlabel(f"Spearman ρ with {outcome} (95% bootstrap)")
    ax.set_title("Predictors ranked by |ρ| (red: ranks a noise control as robust)", fontsize=9)
    fig.tight_layout()
    path = out / "plots" / "ranking.png"
    save_figure(fig, path)
    written.append(path)
    return written
