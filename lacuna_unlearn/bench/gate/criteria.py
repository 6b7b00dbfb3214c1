"""The criteria of ``lacuna gate`` and what they are checked against: metric keys, thresholds, verdicts.

The metric keys are those of :data:`lacuna_unlearn.bench.metric_table.METRIC_TABLE` (one table for ``lacuna run``, the
gate and the reports); a criterion names one of them or a dotted JSON path (docs/ci.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.metric_table import METRIC_TABLE

__all__ = [
    "FAIL",
    "METRICS",
    "MISSING",
    "PASS",
    "Criterion",
    "Document",
    "GateError",
    "Subject",
    "Verdict",
    "builtin_criteria",
    "evaluate",
    "exit_code",
    "parse_check",
]

PASS, FAIL, MISSING = "PASS", "FAIL", "MISSING"

#: Metric keys every subject may carry (usable in ``--check`` as bare names), with their meaning.
METRICS: dict[str, str] = {key: spec.description for key, spec in METRIC_TABLE.items()}

#: The values a metric can take, where it is bounded (rates and AUCs in [0, 1], a lift in [-1, 1]): a threshold
#: outside can never be met or never fail, so it is refused as a typo.
RANGES: dict[str, tuple[float, float]] = {
    **{
        key: (0.0, 1.0)
        for key in METRIC_TABLE
        if key.startswith(("auc_forget", "auc_unified"))
        or key.endswith(("_leak", "_accuracy", "success_at_n"))
        or key in ("j_w", "j_p", "j_icr", "retain_j_avg", "em", "es", "prob", "success_at_n_unlearned")
    },
    "auc_forget_lift": (-1.0, 1.0),
}

#: Built-in flags: (option, criterion name, metric key, comparison, help).
_BUILTINS: tuple[tuple[str, str, str, str, str], ...] = (
    ("--max-leak", "max-leak", "forget_leak", "<=", "forget QA leak rate <= X"),
    ("--min-retain", "min-retain", "retain_accuracy", ">=", "retain QA accuracy >= X"),
    ("--max-jw", "max-jw", "j_w", "<=", "worst-case leak J_W <= X"),
    (
        "--min-auc",
        "min-auc",
        "auc_forget_calibrated",
        ">=",
        "null-calibrated best localization AUC(F) >= X (needs score.json for lm-eval input; docs/scoring.md)",
    ),
    (
        "--min-auc-unified",
        "min-auc-unified",
        "auc_unified_calibrated",
        ">=",
        "null-calibrated best unified localization AUC >= X",
    ),
    (
        "--min-lift",
        "min-lift",
        "auc_forget_lift",
        ">=",
        "lift of the calibrated AUC(F) family over its null updates >= X (docs/scoring.md)",
    ),
    ("--min-retain-eval", "min-retain-eval", "retain_eval_accuracy", ">=", "held-out retain accuracy >= X"),
    (
        "--max-success",
        "max-success",
        "success_at_n",
        "<=",
        "Success@N <= X (lacuna run: after the relearning attack; lm-eval: the <field>_extraction task)",
    ),
    ("--max-frag", "max-frag", "frag", "<=", "FRAG <= X"),
    (
        "--max-ppl-ratio",
        "max-ppl-ratio",
        "neutral_ppl_ratio",
        "<=",
        "neutral perplexity after/before <= X (lacuna run)",
    ),
    ("--min-frag", "min-frag", "frag", ">=", "FRAG >= X"),
)

_CHECK_RE = re.compile(r"^\s*(?P<path>[^<>=!]*?)\s*(?P<op><=|>=)\s*(?P<value>[^<>=]*?)\s*$")


class GateError(Exception):
    """Bad input for the gate (unreadable/malformed file, unknown method, bad criterion): exit code 2."""


@dataclass(frozen=True)
class Criterion:
    """One threshold: ``metric`` (a :data:`METRICS` key or a dotted JSON path) ``op`` ``threshold``."""

    name: str
    metric: str
    op: str  # "<=" or ">="
    threshold: float

    def __post_init__(self) -> None:
        if self.op not in ("<=", ">="):
            raise GateError(f"criterion {self.name!r}: comparison must be <= or >=, not {self.op!r}")
        if not math.isfinite(self.threshold):
            raise GateError(f"criterion {self.name!r}: threshold {self.threshold} is not a finite number")
        lo, hi = RANGES.get(self.metric, (-math.inf, math.inf))
        if not lo <= self.threshold <= hi:
            raise GateError(
                f"criterion {self.name!r}: threshold {self.threshold:g} is outside {self.metric}'s [{lo:g}, {hi:g}]"
            )

    def holds(self, value: float) -> bool:
        """Whether ``value`` satisfies the criterion (NaN never does; equality passes)."""
        return value <= self.threshold if self.op == "<=" else value >= self.threshold

    @property
    def is_metric_key(self) -> bool:
        return self.metric in METRICS


@dataclass
class Document:
    """One input file: its kind (``run``, ``lm-eval`` or ``score``) and parsed JSON (the dotted-path root)."""

    path: Path
    kind: str
    root: Mapping[str, Any]


@dataclass
class Subject:
    """What criteria are checked against: one method of a run, or one evaluated checkpoint."""

    name: str
    document: Document
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    base: tuple[str, ...] = ()  # where the subject lives in ``document.root`` (relative dotted paths)
    notes: list[str] = dataclasses.field(default_factory=list)
    checkpoint: dict[str, Any] | None = None  # the checkpoint it describes (path, fingerprint, verification)
    # a further unlearning seed of a multi-seed run: only its metric keys are known (dotted paths read the file,
    # which holds the first seed's entry)
    seed: int | None = None


@dataclass(frozen=True)
class Verdict:
    """The outcome of one criterion on one subject."""

    criterion: Criterion
    subject: str
    source: str
    value: Any  # the raw value found (None when absent)
    status: str  # PASS, FAIL or MISSING
    message: str

    @property
    def number(self) -> float | None:
        return self.value if _is_number(self.value) else None


def _lookup(root: Any, segments: Sequence[str]) -> tuple[bool, Any]:
    """Follow dotted ``segments`` into ``root``; keys containing dots are matched greedily."""
    node = root
    i = 0
    while i < len(segments):
        if isinstance(node, Mapping):
            for j in range(len(segments), i, -1):
                key = ".".join(segments[i:j])
                if key in node:
                    node, i = node[key], j
                    break
            else:
                return False, None
        elif isinstance(node, list) and segments[i].lstrip("-").isdigit():
            k = int(segments[i])
            if not -len(node) <= k < len(node):
                return False, None
            node, i = node[k], i + 1
        else:
            return False, None
    return True, node


def _get(root: Any, dotted: str) -> Any:
    return _lookup(root, dotted.split("."))[1]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: Any, threshold: float | None = None) -> str:
    """A short rendering of ``value`` that never looks equal to ``threshold`` when it is not."""
    if value is None:
        return "-"
    if not _is_number(value):
        text = repr(value)
        return text if len(text) <= 24 else text[:21] + "..."
    value = float(value)
    short = f"{value:.6g}"
    if threshold is not None and float(short) == threshold and value != threshold:
        return repr(value)
    return short


# -------------------------------------------------------------------------------------------- criteria


def parse_check(text: str) -> Criterion:
    """``'PATH<=VALUE'`` / ``'PATH>=VALUE'`` as a criterion; PATH is a :data:`METRICS` key or a dotted
    JSON path (absolute, e.g. ``methods.oracle_grad.auc.forget.best.value``, ``methods.*.l2``, or
    relative to each subject, e.g. ``auc.forget.raw``). Raises :class:`GateError` on bad syntax."""
    m = _CHECK_RE.match(text)
    if not m or not m["path"] or not m["value"]:
        raise GateError(f"bad --check {text!r}: expected PATH<=VALUE or PATH>=VALUE")
    path = m["path"]
    if any(not seg for seg in path.split(".")) or any(c.isspace() for c in path):
        raise GateError(f"bad --check {text!r}: {path!r} is not a dotted path")
    try:
        threshold = float(m["value"])
    except ValueError:
        raise GateError(f"bad --check {text!r}: threshold {m['value']!r} is not a number") from None
    if not math.isfinite(threshold):
        raise GateError(f"bad --check {text!r}: threshold {m['value']!r} is not a finite number")
    return Criterion(f"check {path}", path, m["op"], threshold)


def builtin_criteria(args: argparse.Namespace) -> list[Criterion]:
    """The criteria of the built-in flags that were given, in flag order."""
    out = []
    for option, name, metric, op, _ in _BUILTINS:
        value = getattr(args, option.lstrip("-").replace("-", "_"), None)
        if value is not None:
            out.append(Criterion(name, metric, op, value))
    return out


# ------------------------------------------------------------------------------------------ evaluation


def _judge(criterion: Criterion, subject: str, source: Path, found: bool, value: Any, where: str) -> Verdict:
    def verdict(status: str, message: str) -> Verdict:
        return Verdict(criterion, subject, str(source), value if found else None, status, message)

    if not found or value is None:
        return verdict(MISSING, f"{where} not measured (absent from {source.name})")
    if not _is_number(value):
        return verdict(FAIL, f"{where} is not a number: {value!r}")
    if not math.isfinite(value):
        return verdict(FAIL, f"{where} is {'NaN' if math.isnan(value) else value} (not a finite number)")
    shown = f"{criterion.metric} = {_fmt(value, criterion.threshold)}"
    if criterion.holds(value):
        return verdict(PASS, f"{shown} {criterion.op} {_fmt(criterion.threshold)}")
    return verdict(FAIL, f"{shown}, required {criterion.op} {_fmt(criterion.threshold)}")


def evaluate(subjects: Sequence[Subject], criteria: Sequence[Criterion]) -> list[Verdict]:
    """Check every criterion against every subject (criteria outer, subjects inner).

    A metric-key criterion reads ``subject.metrics``. A dotted path is absolute when its first
    segment is a top-level key of the input file: ``methods.NAME.…`` gives one verdict for method
    NAME in every field of the run, ``methods.*.…`` one per selected method and field, any other absolute path
    one verdict per run
    (subject ``baseline`` or ``run``). Otherwise it is relative to each subject (a method entry,
    or the lm-eval JSON root, which also holds ``score`` when a score.json was given).
    """
    verdicts: list[Verdict] = []
    documents: list[Document] = []
    for s in subjects:
        if not any(d is s.document for d in documents):
            documents.append(s.document)
    for c in criteria:
        if c.is_metric_key:
            for s in subjects:
                found = c.metric in s.metrics
                verdicts.append(_judge(c, s.name, s.document.path, found, s.metrics.get(c.metric), c.metric))
            continue
        segments = c.metric.split(".")
        for doc in documents:
            members = [s for s in subjects if s.document is doc and s.seed is None]
            root = doc.root
            if doc.kind == "run" and segments[0] == "methods" and len(segments) > 1:
                # one verdict per subject of that method: on a run over several fields, one per field
                chosen = [s for s in members if segments[1] == "*" or (s.base and s.base[-1] == segments[1])]
                for s in chosen:
                    found, value = _lookup(root, [*s.base, *segments[2:]])
                    verdicts.append(_judge(c, s.name, doc.path, found, value, c.metric))
                if not chosen:
                    found, value = _lookup(root, segments)
                    verdicts.append(_judge(c, segments[1], doc.path, found, value, c.metric))
            elif doc.kind == "run" and segments[0] in root:
                found, value = _lookup(root, segments)
                label = "baseline" if segments[0] == "baseline" else "run"
                verdicts.append(_judge(c, label, doc.path, found, value, c.metric))
            else:
                for s in members:
                    found, value = _lookup(root, [*s.base, *segments])
                    verdicts.append(_judge(c, s.name, doc.path, found, value, c.metric))
    return verdicts


def exit_code(verdicts: Iterable[Verdict], *, allow_missing: bool = False) -> int:
    """0 when every verdict passes (MISSING counts as passing only with ``allow_missing``), else 1."""
    bad = {FAIL} if allow_missing else {FAIL, MISSING}
    return 1 if any(v.status in bad for v in verdicts) else 0
