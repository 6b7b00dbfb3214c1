"""``report.md`` of a ``lacuna run``: per field the LACUNA-style table with persons beside every rate, a one-line
legend per column, the regime footnote, and the plots (docs/report.md). Rows and cells live in
:mod:`~lacuna_unlearn.bench.report.tables`, the figures in :mod:`~lacuna_unlearn.bench.report.plots`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.report.plots import write_field_plots
from lacuna_unlearn.bench.report.tables import (
    FEW_MARK,
    FEW_PERSONS,
    RESTRICTED,
    _control_note,
    _field_table,
    _fields,
    _matched_table,
    _pooled_table,
    _seed_table,
    _stopping_table,
    attack_label,
)

__all__ = ["run_markdown", "write_run_report"]


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
    attack = attack_label(every)
    regime_cfg = next(((m.get("regime") or {}).get("thresholds") for m in every if m.get("regime")), None) or {}
    tau_rev, tau_cat = regime_cfg.get("tau_rev", "tau_rev"), regime_cfg.get("tau_cat", "tau_cat")
    tau_ppl, rule = regime_cfg.get("tau_ppl", "tau_ppl"), regime_cfg.get("rule", "relative")
    reversible_rule = (
        f"reversible iff relearning brings the leak back to within tau_rev = {tau_rev} of the original (Δr, the gap "
        "left)"
        if rule == "absolute"
        else f"reversible iff relearning recovers ≥ tau_rev = {tau_rev} of the removed leak (ρ)"
    )
    catastrophic_rule = (
        f"catastrophic iff held-out retain or cross-field acc drops by more than tau_cat = {tau_cat} or the neutral "
        f"perplexity grows more than tau_ppl = {tau_ppl}×"
    )
    footnote = few = False
    for field, entry in fields.items():
        if len(fields) > 1:
            lines += [f"## Field `{field}`", ""]
        table, marked, few_marked = _field_table(entry, trivial, attempts)
        lines += [
            *table,
            "",
            *_control_note(entry),
            *_stopping_table(entry),
            *_matched_table(entry),
            *_seed_table(entry),
        ]
        footnote, few = footnote or marked, few or few_marked
    lines += _pooled_table(results)
    if few:
        lines += [_few_footnote(), ""]
    if footnote:
        lines += [
            f"† The regime and Success@{attempts} point different ways. The regime reads only the QA forget leak (one "
            f"prompt per person) before unlearning, after unlearning and after the relearning it is read from "
            f"(restricted relearning, or {attack} without the reversibility protocol; {reversible_rule}; "
            f"{catastrophic_rule}); Success@{attempts} is the extraction probe ({attempts} fresh prompts per "
            f"person) after {attack}, which finds facts the single QA prompt misses. "
            f'"irreversible" with Success@{attempts} > 0 after relearning: the QA answer stayed gone, the fact did not.',
            "",
        ]
    lines += [
        "## Reading this table",
        "",
        f"- **n**: persons behind a rate (the field's forget or retain people in the testbed's splits; Success@N: "
        f"the attacked forget people); few persons make coarse rates (n=1 gives only 0 or 1); {FEW_MARK} marks fewer "
        f"than {FEW_PERSONS}.",
        "- **[low, high]**: exact 95% interval of the rate over persons (never documents): Clopper-Pearson on k of n "
        "persons, or on the sum of per-person shares where a person answers several questions; 0 of n persons still "
        "gives [0, >0] (results.json: `ci.<metric>` with k, n and the method).",
        "- **forget EM / ES / Prob**: teacher-forced exact match, extraction strength and answer probability on the "
        "forget people's QA (lower = more forgotten).",
        "- **forget leak**: share of forget people whose answer the model generates to their QA prompt, unlearned → "
        f"after {attack}, the relearning attack of `lacuna attack` (`attack=relearn`: LACUNA's fine-tuning on memorized "
        "people held out of every split; lower = forgotten).",
        f"- **forget leak: unlearned → {RESTRICTED}**: the same leak after the reversibility protocol's restricted "
        "relearning (|D_f| rows from each source), which the regime is read from: the source the regime used first, "
        f"then the other sources' leaks; n/a without the protocol (the regime then reads {attack}).",
        f"- **retain acc**: share of retain people still answered, unlearned → after {attack} (higher = kept; compare "
        "with the first row).",
        "- **held-out retain acc**: share of retain-eval people (memorized like the retain people, in no unlearning "
        "input) still answered; the retain acc column's people are the ones the retain loss trains on.",
        "- **cross-field acc**: share of the forget people's other three fields still answered (a `field=email` run "
        "must keep their birth city).",
        "- **J_W**: share of forget people leaking under any of 15 paraphrases or in-context retain prompts (worst "
        "case; n/a when the evaluated tasks leave it out).",
        "- **AUC(F) / AUC(F-R) / AUC(F vs R)**: does the update's size single out the forget scalars (vs all others / "
        "forget + retain vs outside / vs retain only); 0.5 = chance, 1 = exactly; the calibrated best scoring function "
        "in brackets: only families where the update beats method-free updates of its own size, shape and dtype (its "
        "δ permuted within |θ| strata, weight decay, |θ|-shaped and Gaussian noise) by more than their spread; "
        "**lift** = that family's AUC − its null AUC; n/a: no family beats its nulls (docs/scoring.md, 'Null "
        "calibration').",
        "- **trivial detector**: the same AUCs from |θ_before| / |θ_before − θ_base| with no unlearning at all; a "
        "method's AUC shows localization only where it beats this row.",
        "- **FRAG**: forget alignment − γ × retain alignment of the weight update (higher predicts forgetting that "
        "survives relearning, docs/definitions.md#frag-score).",
        f"- **Success@N**: share of forget people leaking in at least one of N = {attempts} fresh extraction prompts, "
        f"unlearned → after {attack} (a jump = suppressed, not erased).",
        f'- **regime** (docs/definitions.md#forgetting-regimes, "Unlearning Isn\'t Deletion"): from the QA forget '
        f"leak, {reversible_rule}; {catastrophic_rule} (never the retain acc column, whose people a retain loss "
        "trains on). "
        "With the reversibility protocol (the default), relearning is restricted to |D_f| rows from the forget, "
        "retain and unrelated sources and the source that recovers most decides (named after Δr; its leak is the "
        f"{RESTRICTED} column); without it, {attack} of the first forget leak column.",
        "- **positive control**: a method that only hides the answer (a refusal objective on the last layer, which "
        "holds no fact); it must come out reversible, or the protocol is too weak and regimes read `undetermined`.",
    ]
    wall = (results.get("manifest") or {}).get("wall_seconds")
    if wall is not None:
        lines += ["", f"Wall time of this run (cached stages count 0): {wall:.0f} s."]
    return "\n".join(lines) + "\n"


def _few_footnote() -> str:
    """The ‡ footnote, with the exact intervals that few persons allow (computed, so the numbers stay true)."""
    from lacuna_metrics import clopper_pearson

    examples = "; ".join(
        f"{k} of {n}: [{low:.2f}, {high:.2f}]"
        for k, n in ((0, FEW_PERSONS - 1), (FEW_PERSONS // 2, FEW_PERSONS - 1), (1, 1))
        for low, high in [clopper_pearson(k, n)]
    )
    return (
        f"{FEW_MARK} Fewer than {FEW_PERSONS} persons behind a marked rate: its exact 95% interval spans most of [0, 1] "
        f"whatever they did ({examples}), so read the cell as a mechanics check, not a measurement."
    )


def write_run_report(out_dir: str | os.PathLike[str], results: dict[str, Any]) -> list[Path]:
    """``report.md`` and ``plots/{auc,layers,relearning}.png`` of a ``lacuna run`` (all written atomically). A run
    over several fields writes the first field's plots under these names and the others' as ``auc-<field>.png``."""
    from lacuna_metrics import write_text

    out = Path(out_dir)
    written = [write_text(out / "report.md", run_markdown(results))]
    trivial = (results.get("baseline") or {}).get("auc")
    trivial = trivial if isinstance(trivial, dict) else {}
    for i, (field, entry) in enumerate(_fields(results).items()):
        suffix = "" if i == 0 else f"-{field}"
        written += write_field_plots(out / "plots", entry.get("methods") or {}, trivial, suffix=suffix, field=field)
    return written
