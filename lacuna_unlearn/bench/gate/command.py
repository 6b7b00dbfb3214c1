"""``lacuna gate``: pass/fail thresholds on Lacuna results, for CI.

Reads a ``lacuna run`` ``results.json`` (one subject per method), an lm-evaluation-harness results
JSON or ``--output_path`` directory (one subject: the checkpoint; optionally with a ``lacuna score``
``score.json`` for AUC/FRAG), or a ``score.json`` alone. Every criterion is checked against every
subject; the verdicts are printed as a table and optionally written as JUnit XML and JSON.

Results it combines must describe one checkpoint: lm-eval results and their ``--score`` are paired only
when the checkpoint lm-eval evaluated (``pretrained=`` in ``config.model_args``, fingerprinted where it
is now) has the content fingerprint the score.json recorded for its ``after`` checkpoint. A mismatch is
always refused; a pair that cannot be verified (score.json older than schema 2, checkpoint gone or a hub
model not in the local cache, weights rewritten after the evaluation, an adapter) is refused unless
``--allow-unverified``. See ``docs/ci.md``.

Exit codes: 0 all criteria pass, 1 some criterion fails (or is MISSING without ``--allow-missing``),
2 bad input (unreadable or malformed file, unknown method, bad ``--check``, no criteria, mismatched or
unverifiable checkpoints).

This module is the command (arguments, the run, its output); the concepts live beside it and are re-exported
here: :mod:`~lacuna_unlearn.bench.gate.criteria` (metric keys, criteria, verdicts), :mod:`~lacuna_unlearn.bench.gate.subjects`
(inputs), :mod:`~lacuna_unlearn.bench.gate.identity` (checkpoint pairing), :mod:`~lacuna_unlearn.bench.gate.output` (table,
JUnit, JSON).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from lacuna_tasks import find_lm_eval_results
from lacuna_unlearn.bench.gate.criteria import (
    _BUILTINS,
    FAIL,
    METRICS,
    MISSING,
    PASS,
    Criterion,
    Document,
    GateError,
    Subject,
    Verdict,
    builtin_criteria,
    evaluate,
    exit_code,
    parse_check,
)
from lacuna_unlearn.bench.gate.identity import Identity, _short, fingerprint_memo, verify_pair
from lacuna_unlearn.bench.gate.output import format_table, verdicts_json, write_junit
from lacuna_unlearn.bench.gate.subjects import _kind, _load_score, _read_json, _resolve_input, load_subjects

__all__ = [
    "FAIL",
    "METRICS",
    "MISSING",
    "PASS",
    "Criterion",
    "Document",
    "GateError",
    "Identity",
    "Subject",
    "Verdict",
    "add_arguments",
    "builtin_criteria",
    "evaluate",
    "exit_code",
    "find_lm_eval_results",
    "format_table",
    "load_subjects",
    "main",
    "parse_check",
    "run",
    "verdicts_json",
    "verify_pair",
    "write_junit",
]

logger = logging.getLogger(__name__)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"threshold {text!r} is not a finite number")
    return value


#: keyword arguments of ``lacuna gate``'s ``add_parser`` (:mod:`lacuna_unlearn.bench.cli.main`).
PARSER = dict(
    help="CI gate: pass/fail criteria over results.json, lm-eval results or score.json (exit 1 on failure)",
    description="Check thresholds (--max-leak, --min-auc, --check PATH<=X, ...); see docs/ci.md.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``lacuna gate`` arguments to ``parser`` (a subparser of the main CLI)."""
    parser.description = parser.description or (
        "Check Lacuna results against thresholds. Exit 0 if every criterion passes, 1 if one fails "
        "(or is MISSING without --allow-missing), 2 on bad input."
    )
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="a `lacuna run` results.json (or its directory), an lm-eval results JSON or --output_path "
        "directory (newest results_*.json under it), or a `lacuna score` score.json",
    )
    parser.add_argument(
        "--method", action="append", metavar="NAME", help="gate only this method of a results.json (repeatable)"
    )
    parser.add_argument(
        "--field", help="field of the lm-eval tasks (lacuna_<field>_*); default: the single field present"
    )
    parser.add_argument(
        "--score",
        action="append",
        metavar="SCORE_JSON",
        help="`lacuna score` score.json for AUC/FRAG criteria on lm-eval input (once for all lm-eval "
        "inputs, or once per lm-eval input, in order)",
    )
    crit = parser.add_argument_group("criteria (at least one)")
    for option, _, _, _, help_text in _BUILTINS:
        crit.add_argument(option, type=_threshold, metavar="X", help=help_text)
    crit.add_argument(
        "--check",
        action="append",
        metavar="'PATH<=X'",
        help="generic criterion PATH<=X or PATH>=X (repeatable); PATH is a metric key "
        f"({', '.join(METRICS)}) or a dotted path into the JSON, e.g. "
        "methods.oracle_grad.auc.forget.best.value>=0.85, methods.*.l2<=50, score.frag.forget_alignment>=0.1",
    )
    parser.add_argument(
        "--allow-missing", action="store_true", help="a criterion whose metric was not measured does not fail"
    )
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="gate lm-eval results with a --score whose checkpoint identity cannot be verified (score.json "
        "without fingerprints, checkpoint directory gone or a hub model not cached, weights rewritten after "
        "the evaluation); a proven mismatch is refused anyway",
    )
    parser.add_argument("--junit", metavar="FILE", help="write the verdicts as JUnit XML")
    parser.add_argument("--json", dest="json_out", metavar="FILE", help="write the verdicts as JSON")


def _collect_subjects(args: argparse.Namespace) -> list[Subject]:
    paths = [Path(p) for p in args.results]
    kinds = [_kind(_read_json(_resolve_input(p))) for p in paths]
    for p, k in zip(paths, kinds, strict=True):
        if k is None:
            load_subjects(p)  # raises the "not a results file" error
    scores = list(args.score or [])
    lm_eval_inputs = [p for p, k in zip(paths, kinds, strict=True) if k == "lm-eval"]
    if scores and not lm_eval_inputs:
        raise GateError("--score applies to lm-eval results, but no lm-eval results were given")
    if len(scores) not in (0, 1, len(lm_eval_inputs)):
        raise GateError(
            f"{len(scores)} --score files for {len(lm_eval_inputs)} lm-eval inputs: give one, or one per lm-eval input"
        )
    if args.method and "run" not in kinds:
        raise GateError("--method applies to a lacuna results.json, but none was given")
    for s in scores:
        _load_score(s)  # every score.json is readable before any checkpoint is fingerprinted
    allow = bool(getattr(args, "allow_unverified", False))
    subjects: list[Subject] = []
    i = 0
    with fingerprint_memo():
        for p, k in zip(paths, kinds, strict=True):
            score = None
            if k == "lm-eval" and scores:
                score = scores[i] if len(scores) > 1 else scores[0]
                i += 1
            method = args.method if k == "run" else None
            subjects += load_subjects(p, methods=method, field=args.field, score=score, allow_unverified=allow)
    return subjects


def _check_writable(flag: str, path: Path) -> None:
    """A report file that cannot be written fails before any input is read (not after the table is printed)."""
    from lacuna_metrics import symlink_loop_error

    if (loop := symlink_loop_error(f"{flag} {path}", path)) is not None:
        raise GateError(loop)
    if path.is_dir():
        raise GateError(f"{flag} {path}: is a directory")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise GateError(f"{flag} {path}: {parent} is not a writable directory")


def run(args: argparse.Namespace) -> int:
    """Run the gate for parsed ``args``: print the table, write ``--junit``/``--json``, return the exit code."""
    try:
        criteria = builtin_criteria(args) + [parse_check(t) for t in args.check or []]
        if not criteria:
            raise GateError(
                "no criteria: give at least one of "
                + ", ".join(option for option, *_ in _BUILTINS)
                + " or --check 'PATH<=X'"
            )
        for flag, target in (("--junit", args.junit), ("--json", args.json_out)):
            if target:
                _check_writable(flag, Path(target))
        subjects = _collect_subjects(args)
        verdicts = evaluate(subjects, criteria)
        if not verdicts:
            raise GateError("nothing to check")
    except GateError as exc:
        print(f"lacuna gate: error: {exc}", file=sys.stderr)
        return 2
    for note in dict.fromkeys(n for s in subjects for n in s.notes):
        logger.warning("lacuna gate: warning: %s", note)
    for source in dict.fromkeys((str(s.document.path), s.document.kind) for s in subjects):
        print(f"input: {source[0]} ({source[1]})")
        for s in subjects:
            record = s.checkpoint
            if str(s.document.path) == source[0] and s.document.kind == "lm-eval" and record is not None:
                status = "verified" if record["verified"] else "UNVERIFIED (--allow-unverified)"
                fp = _short(record["fingerprint"])
                print(f"  checkpoint: {record['path']} ({fp}) = {record['score']} after: {status}")
    print()
    print(format_table(verdicts, allow_missing=args.allow_missing))
    try:
        if args.junit:
            write_junit(args.junit, verdicts, allow_missing=args.allow_missing)
        if args.json_out:
            from lacuna_metrics import write_json

            write_json(args.json_out, verdicts_json(verdicts, subjects, allow_missing=args.allow_missing))
    except OSError as exc:
        from lacuna_metrics import error_line

        print(f"lacuna gate: error: {error_line(exc)}", file=sys.stderr)  # names the report file and the cause
        return 2
    return exit_code(verdicts, allow_missing=args.allow_missing)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lacuna_unlearn.bench.gate.command ...`` (the same as ``lacuna gate ...``)."""
    parser = argparse.ArgumentParser(prog="lacuna gate")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
