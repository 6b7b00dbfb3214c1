"""The markdown tables of a ``lacuna run`` report: one row per method with persons and intervals beside every rate,
the positive-control note, matched forgetting and mean ± sd over seeds (docs/report.md). :mod:`lacuna_unlearn.bench.report.markdown`
assembles them into ``report.md``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lacuna_metrics import fmt as _fmt

__all__ = ["FEW_MARK", "FEW_PERSONS", "RESTRICTED", "SEED_COLUMNS", "attack_label", "disagrees"]

#: A rate resting on fewer persons than this is marked with :data:`FEW_MARK` beside its ``n`` and footnoted: its
#: exact interval spans most of [0, 1] whatever the outcome (0 of 4 persons: [0, 0.60]).
FEW_PERSONS = 5
FEW_MARK = "‡"

#: How the report names the restricted relearning of the reversibility protocol, which the regime is read from
#: (``reversibility.sources``); :func:`attack_label` names the other relearning it shows.
RESTRICTED = "restricted relearning (regime)"


def attack_label(methods: Iterable[dict[str, Any]]) -> str:
    """How the report names the relearning attack behind Success@N and the ``relearned_behaviour`` rates: its preset,
    ``attack=relearn`` by default (LACUNA's relearning on memorized people held out of every split), so that it is
    never read as the restricted relearning the regime comes from."""
    protocols = {(m.get("attack") or {}).get("protocol") for m in methods} - {None}
    return f"attack={protocols.pop()}" if len(protocols) == 1 else "relearning attack"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _interval(ci: Any) -> str:
    """`` [lo, hi]`` from an interval record ``{"low", "high", ...}`` (results.json schema 2) or a two-number list
    (schema 1), else nothing: intervals are shown where the results carry them."""
    if isinstance(ci, dict):
        ci = [ci.get("low"), ci.get("high")]
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
        return f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return ""


def _n(n: Any, detail: str = "") -> str:
    """`` (n=6)`` (``detail`` inside the parentheses, after the count), with :data:`FEW_MARK` after it below
    :data:`FEW_PERSONS` persons; nothing without a count."""
    if not isinstance(n, int) or isinstance(n, bool):
        return ""
    return f" (n={n}{detail}){FEW_MARK if n < FEW_PERSONS else ''}"


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


def _restricted(beh: dict[str, Any], method: dict[str, Any]) -> str:
    """The forget leak unlearned → after restricted relearning (the reversibility protocol the regime is read from):
    the regime's source first, with its interval and persons, then every other source's leak; ``n/a`` without the
    protocol (the regime then comes from the held-out relearning attack)."""
    rev = method.get("reversibility") or {}
    sources = rev.get("sources") or {}
    chosen = (rev.get("regime") or {}).get("source") or (method.get("regime") or {}).get("source")
    if chosen not in sources:
        return "n/a"
    others = ", ".join(f"{s} {_pct(r.get('forget_leak'))}" for s, r in sources.items() if s != chosen)
    return f"{_relearned(beh, sources[chosen], 'forget_leak')} from {chosen}" + (f"; {others}" if others else "")


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
    return "n/a" if value is None else f"×{value:.4g}"


def _field_table(entry: dict[str, Any], trivial: dict[str, Any], attempts: Any) -> tuple[list[str], bool, bool]:
    """The field's table, whether a regime cell carries the † footnote, and whether a rate rests on fewer than
    :data:`FEW_PERSONS` persons (the ‡ footnote)."""
    base = (entry.get("baseline") or {}).get("behaviour") or {}
    attack = attack_label((entry.get("methods") or {}).values())
    lines = [
        f"| method | forget EM / ES / Prob | forget leak: unlearned → {attack} | forget leak: unlearned → {RESTRICTED} "
        f"| retain acc: unlearned → {attack} | held-out retain acc | cross-field acc | neutral ppl ratio | J_W | AUC(F) "
        f"| AUC(F-R) | AUC(F vs R) | FRAG | Success@{attempts}: unlearned → {attack} | regime |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def memorization(b: dict[str, Any]) -> str:
        values = [b.get(k) for k in ("em", "es", "prob")]
        if all(v is None for v in values):
            return "n/a"
        n = next((v for v in ((b.get("n") or {}).get(k) for k in ("em", "es", "prob")) if v is not None), None)
        return " / ".join(_pct(v) for v in values) + _n(n)

    lines.append(
        f"| before unlearning | {memorization(base)} | {_rate(base, 'forget_leak')} | {_rate(base, 'forget_leak')} "
        f"| {_rate(base, 'retain_accuracy')} | {_rate(base, 'retain_eval_accuracy')} "
        f"| {_rate(base, 'crossfield_accuracy')} | {_ppl(base)} | {_rate(base, 'j_w')} | | | | | | |"
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

        success = (
            _change(
                att.get("success_at_n_unlearned"), att.get("success_at_n_relearned"), att.get("persons"),
                (att.get("ci") or {}).get("success_at_n_unlearned"), (att.get("ci") or {}).get("success_at_n_relearned"),
            )
            if att else "n/a"
        )  # fmt: skip
        regime = m.get("regime") or {}
        label = regime.get("regime", "n/a") + _regime_note(regime)
        if disagrees(m):
            label += " †"
            footnote = True
        frag = m.get("frag")
        lines.append(
            f"| {name} | {memorization(beh)} | {_relearned(beh, rel, 'forget_leak')} | {_restricted(beh, m)} "
            f"| {_relearned(beh, rel, 'retain_accuracy')} "
            f"| {_rate(beh, 'retain_eval_accuracy')} | {_rate(beh, 'crossfield_accuracy')} | {_ppl_ratio(beh)} "
            f"| {_rate(beh, 'j_w')} | {best('forget')} | {best('unified')} | {best('forget_vs_retain')} "
            f"| {'n/a' if frag is None else f'{frag:.3g}'} | {success} | {label} |"
        )
    control = entry.get("positive_control")
    if control:
        regime = control.get("regime") or {}
        label = regime.get("regime", "n/a") + _regime_note(regime)
        beh = control.get("behaviour") or {}
        lines.append(
            f"| positive control: {control.get('name')} | {memorization(beh)} | {_rate(beh, 'forget_leak')} "
            f"| {_restricted(beh, control)} | {_rate(beh, 'retain_accuracy')} | {_rate(beh, 'retain_eval_accuracy')} "
            f"| {_rate(beh, 'crossfield_accuracy')} | {_ppl_ratio(beh)} | {_rate(beh, 'j_w')} | | | | | | {label} |"
        )
    if trivial:
        cells = []
        for target in ("forget", "unified", "forget_vs_retain"):
            t = trivial.get(target) or {}
            cells.append(
                " / ".join(f"{t[k]:.3f}" for k in ("before_magnitude", "injection_magnitude") if t.get(k) is not None)
            )
        empty = " |" * 8  # forget EM ... J_W: the detector's AUCs go under the AUC columns
        lines.append(f"| trivial detector (abs before / abs injection) |{empty} {' | '.join(cells)} | | | |")
    return lines, footnote, any(f"){FEW_MARK}" in line for line in lines[2:])


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
    ("AUC(F vs R) calibrated", "auc.forget_vs_retain.calibrated_best"),
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


def _stopping_table(entry: dict[str, Any]) -> list[str]:
    """Each method's stopping point, chosen on validation people, and the end of its schedule as the ablation (empty
    when no method chose one)."""
    chosen = {n: m for n, m in (entry.get("methods") or {}).items() if m.get("stopping")}
    if not chosen:
        return []
    first = next(iter(chosen.values()))["stopping"]
    metric, threshold = first.get("metric"), first.get("threshold")
    lines = [
        f"Stopping points: the table above reads each gradient method at the first step where its **validation** "
        f"people's {metric} is ≤ {threshold} (a validation run of the method that unlearns them; forget and retain "
        "people never enter the choice), carried over as the same share of the forget run's schedule. The end of the "
        "shared schedule is the ablation on the right.",
        "",
        "| method | validation people | chosen: validation step / steps (resolved within) | forget run: step / steps "
        "| at the end of the schedule: forget leak | held-out retain acc |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in chosen.items():
        s = m["stopping"]
        if s.get("skipped"):
            lines.append(
                f"| {name} | 0 | {s['skipped']} | {s.get('chosen_step')} / {s.get('forget_steps')} | same | same |"
            )
            continue
        resolved = f" (±{s['resolved_within_steps']})" if s.get("resolved_within_steps") is not None else ""
        step = f"{s['chosen_validation_step']} / {s['validation_steps']}{resolved}"
        if not s.get("reached"):
            step += f", never ≤ {threshold}: end of schedule"
        end = (m.get("end_of_schedule") or {}).get("behaviour") or {}
        lines.append(
            f"| {name} | {s.get('people')} | {step} | {s.get('chosen_step')} / {s.get('forget_steps')} "
            f"| {_pct(end.get('forget_leak')) if end else 'same'} | {_pct(end.get('retain_eval_accuracy')) if end else 'same'} |"
        )
    return [*lines, ""]


def _control_note(entry: dict[str, Any]) -> list[str]:
    """One line on whether the reversibility protocol passed its positive control (empty without one)."""
    control = entry.get("positive_control")
    if not control:
        return []
    rev = control.get("reversibility") or {}
    setting = f"lr {rev.get('learning_rate')}, {rev.get('epochs')} epochs, |D_f| rows from {', '.join(rev.get('sources') or [])}"
    lines = []
    negative = entry.get("negative_control")
    if negative:
        before, after = negative.get("before") or {}, negative.get("relearned") or {}
        lines += [f"Negative control (learning from scratch): the testbed's model taught {negative.get('people')} "
                  f"people it never saw, with the same relearning budget, leaks {_fraction(after)} of them after "
                  f"relearning ({_fraction(before)} before); a method is reversible only where its relearned leak "
                  "exceeds this beyond their interval.", ""]  # fmt: skip
    by_seed = entry.get("controls_by_seed")
    if by_seed:  # several unlearning seeds: each has its controls, and reads regimes only where they separate
        lines += [
            "| seed | positive control silenced | its leak after relearning | negative control: leak before → after "
            "| regimes read |",
            "|---|---|---|---|---|",
            *(
                f"| {s} | {_pct(c.get('silenced'))} | {_pct(c.get('positive_relearned_leak'))} "
                f"| {_pct(c.get('negative_before_leak'))} → {_pct(c.get('negative_relearned_leak'))} "
                f"| {'yes' if c.get('positive_passed') else 'no'} |"
                for s, c in by_seed.items()
            ),
            "",
        ]
    silenced = control.get("silenced")
    share = "" if silenced is None else f", silencing {silenced:.0%} of the forget facts"
    if control.get("attack_strong_enough"):
        return [*lines, f"Positive control passed: output suppression alone{share} comes out reversible under restricted "
                f"relearning ({setting}) and beyond the negative control, so the protocol can tell suppression from "
                "erasure.", ""]  # fmt: skip
    return [*lines, f"**Positive control failed**: {control.get('reason', 'see results.json')} ({setting}). No regime "
            "is read: every regime (per seed too) is `undetermined`; raise `reversibility.learning_rate` or "
            "`reversibility.epochs`.", ""]  # fmt: skip


def _fraction(rate: dict[str, Any]) -> str:
    """``k/n`` of a rate over persons (``n/a`` when unknown)."""
    value, n = rate.get("forget_leak"), rate.get("n")
    if value is None or not n:
        return "n/a"
    return f"{round(value * n)}/{n}"


def _regime_note(regime: dict[str, Any]) -> str:
    """What decided a regime, after its label: the gap Δr left after relearning (the paper's rule) or the recovery
    ratio ρ (the relative rule), and the relearning source."""
    source = f", from {regime['source']}" if regime.get("source") else ""
    rule = (regime.get("thresholds") or {}).get("rule", "relative")  # results from before the rule was recorded
    if rule == "absolute" and regime.get("forget_gap") is not None:
        return f" (Δr={regime['forget_gap']:.2f}{source})"
    if regime.get("recovery_ratio") is not None:
        return f" (ρ={regime['recovery_ratio']:.2f}{source})"
    return ""


def _pooled_table(results: dict[str, Any]) -> list[str]:
    """One row per method over every field (results.json ``pooled``; empty for a one-field run)."""
    rows = results.get("pooled") or {}
    if not rows:
        return []
    fields = next(iter(rows.values())).get("fields") or []
    lines = [
        f"## Pooled over the fields ({', '.join(fields)})",
        "",
        "Each rate is the persons' total over the fields (n = people × fields) with its exact 95% interval; the "
        "regimes are listed per field.",
        "",
        _pooled_header("regimes"),
        "|---|" + "---|" * (len(POOLED_COLUMNS) + 1),
    ]
    for name, row in rows.items():
        rates = row.get("rates") or {}

        def cell(entry: dict[str, Any]) -> str:
            return f"{entry['value']:.2f}{_interval(entry['ci'])}{_n(entry['ci']['n'])}"

        regimes = ", ".join(str(r) for r in row.get("regimes") or [])
        lines.append(_pooled_row(name, rates, cell, regimes))
    return [*lines, "", *_pooled_seed_table(rows)]


#: The pooled tables' rate columns: (header, results.json pooled metric).
POOLED_COLUMNS = (
    ("forget leak", "forget_leak"),
    ("J_W", "j_w"),
    ("held-out retain acc", "retain_eval_accuracy"),
    ("cross-field acc", "crossfield_accuracy"),
)


def _pooled_header(last: str) -> str:
    return "| method | " + " | ".join(h for h, _ in POOLED_COLUMNS) + f" | {last} |"


def _pooled_row(name: str, values: dict[str, Any], cell: Any, last: str) -> str:
    """One pooled row: ``cell(entry)`` of each column's entry in ``values`` (n/a where missing), then ``last``."""
    cells = [cell(values[m]) if values.get(m) else "n/a" for _, m in POOLED_COLUMNS]
    return f"| {name} | " + " | ".join(cells) + f" | {last} |"


def _seed_cell(entry: dict[str, Any]) -> str:
    """``mean ± sd (n=N; k per seed: 0, 1, 0)``: the spread over seeds and each seed's count, from which its exact
    interval follows (``results.json`` holds the intervals themselves)."""
    ks = [f"{float(ci['k']):g}" for ci in entry.get("cis") or []]
    return _mean_sd(entry) + _n(entry.get("people"), f"; k per seed: {', '.join(ks)}" if ks else "")


def _pooled_seed_table(rows: dict[str, Any]) -> list[str]:
    """The pooled rates' mean ± sd over unlearning seeds (``pooled.<method>.across_seeds``); empty for one seed."""
    summaries = {n: r["across_seeds"] for n, r in rows.items() if r.get("across_seeds")}
    if not summaries:
        return []
    seeds = next(iter(summaries.values())).get("seeds") or []
    lines = [
        f"Pooled, mean ± sd over {len(seeds)} unlearning seeds ({', '.join(map(str, seeds))}); the table above is "
        f"seed {seeds[0] if seeds else '?'}. n is the people × fields behind each seed's rate; the regimes are "
        "per field, one group per seed.",
        "",
        _pooled_header("regimes per seed"),
        "|---|" + "---|" * (len(POOLED_COLUMNS) + 1),
    ]
    for name, summary in summaries.items():
        regimes = " / ".join(", ".join(map(str, r or [])) for r in summary.get("regimes") or []) or "n/a"
        lines.append(_pooled_row(name, summary.get("metrics") or {}, _seed_cell, regimes))
    return [*lines, ""]
