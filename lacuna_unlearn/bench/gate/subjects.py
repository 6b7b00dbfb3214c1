"""The inputs of ``lacuna gate``: which file a path means, its kind, and the subjects criteria are checked on.

Metric locations come from :mod:`lacuna_unlearn.bench.metric_table` (``METRIC_TABLE``) and :mod:`lacuna_metrics.schemas`; lm-eval results are
found and read by the one reader, :mod:`lacuna_tasks.harness.results` (newest run of one model, the ``none``
filter; docs/ci.md).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lacuna_metrics import SCHEMAS, read_schema
from lacuna_tasks import LmEvalResultsError, metric_value, resolve_lm_eval_results
from lacuna_unlearn.bench.gate.criteria import Document, GateError, Subject, _get
from lacuna_unlearn.bench.gate.identity import (
    _run_method_identity,
    _score_identity,
    _score_version_notes,
    verify_pair,
)
from lacuna_unlearn.bench.metric_table import lm_eval_metrics, run_metric_paths, score_metric_paths

__all__ = ["load_subjects"]

RUN_SCHEMA, RUN_SCHEMA_VERSION = SCHEMAS["run"]
SCORE_SCHEMA = SCHEMAS["score"][0]

#: lm-eval task (suffix after ``lacuna_<field>_``), metric and our metric key.
_LM_EVAL_METRICS: tuple[tuple[str, str, str], ...] = lm_eval_metrics()
#: Our metric keys inside a ``results.json`` method entry (dotted paths relative to ``methods.<name>``).
_RUN_METRICS: dict[str, str] = run_metric_paths()
#: Our metric keys inside a ``score.json``.
_SCORE_METRICS: dict[str, str] = score_metric_paths()

#: The tasks whose names tell the field of lm-eval results: every task of the metric table, and the other
#: per-field LACUNA task families (docs/tasks.md).
_TASK_RE = re.compile(
    r"^lacuna_(?P<field>[a-z0-9_]+?)_(?:(?:forget|retain)_(?:qa|paraphrase|icr|worstcase|memorization)|extraction|"
    + "|".join(sorted({re.escape(task) for task, _, _ in _LM_EVAL_METRICS}))
    + r")$"
)


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GateError(f"{path}: no such file or directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GateError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GateError(f"{path}: malformed JSON: {exc}") from None


def _kind(doc: Any) -> str | None:
    """``run``, ``score`` or ``lm-eval`` (results and configs), by the schema name in either shape
    (:func:`lacuna_metrics.schemas.read_schema`); None for anything else."""
    if not isinstance(doc, dict):
        return None
    name, _ = read_schema(doc)
    if name == RUN_SCHEMA:
        return "run"
    if name == SCORE_SCHEMA:
        return "score"
    if isinstance(doc.get("results"), dict) and "configs" in doc:
        return "lm-eval"
    return None


def _resolve_input(path: Path) -> Path:
    """The results file behind ``path``: ``DIR/results.json`` of a run, else the lm-eval results file ``path``
    means (:func:`lacuna_tasks.harness.results.resolve_lm_eval_results`: itself, the newest run of the one model
    under a directory, the newest ``x_<timestamp>.json`` for lm-eval's ``--output_path out/x.json``)."""
    if path.is_dir():
        run_file = path / "results.json"
        if run_file.is_file() and _kind(_read_json(run_file)) == "run":
            return run_file
    try:
        return resolve_lm_eval_results(path)
    except FileNotFoundError as exc:
        raise GateError(f"{exc} (and no results.json)" if path.is_dir() else str(exc)) from None
    except LmEvalResultsError as exc:
        raise GateError(str(exc)) from None


def _lm_eval_fields(results: Mapping[str, Any]) -> list[str]:
    return sorted({m["field"] for task in results if (m := _TASK_RE.match(str(task)))})


def _model_name(doc: Mapping[str, Any], path: Path) -> str:
    name = doc.get("model_name")
    if isinstance(name, str) and name:
        return name
    config = doc.get("config")
    args = config.get("model_args") if isinstance(config, Mapping) else None
    if isinstance(args, Mapping) and args.get("pretrained"):
        return str(args["pretrained"])
    if isinstance(args, str):
        for part in args.split(","):
            key, _, value = part.partition("=")
            if key.strip() == "pretrained" and value:
                return value.strip()
    return path.parent.name or str(path)


def _score_metrics(score: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _get(score, dotted) for key, dotted in _SCORE_METRICS.items()}


def _load_score(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    doc = _read_json(path)
    if _kind(doc) != "score":
        raise GateError(f'{path}: not a lacuna score.json (expected "schema": {SCORE_SCHEMA!r})')
    return doc


def load_subjects(
    path: str | os.PathLike[str],
    *,
    methods: Sequence[str] | None = None,
    field: str | None = None,
    score: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    allow_unverified: bool = False,
) -> list[Subject]:
    """The subjects of one input: every method (or only ``methods``) of a ``lacuna run`` results.json,
    or the checkpoint of an lm-eval results JSON / ``--output_path`` directory (``field`` picks the
    ``lacuna_<field>_*`` tasks; default: the single field present), or the checkpoint of a score.json.

    ``score`` (a score.json path or parsed dict) adds AUC/FRAG metrics to lm-eval input; under the
    key ``score`` it is also reachable by dotted ``--check`` paths. The pair must describe the same
    checkpoint (see :func:`verify_pair`; ``allow_unverified`` accepts pairs that cannot be checked).
    Raises :class:`GateError` on bad input, mismatched or (without ``allow_unverified``) unverifiable pairs.
    """
    resolved = _resolve_input(Path(path))
    doc = _read_json(resolved)
    kind = _kind(doc)
    if kind is None:
        raise GateError(
            f'{resolved}: not a lacuna results.json ("schema": {{"name": {RUN_SCHEMA!r}}}), '
            'lm-eval results JSON ("results" and "configs") or lacuna score.json'
        )
    if kind != "lm-eval" and score is not None:
        raise GateError(f"--score applies to lm-eval results, but {resolved} is a lacuna {kind} file")
    if kind != "run" and methods:
        raise GateError(f"--method applies to a lacuna results.json, but {resolved} is {kind} output")
    if kind == "run":
        return _run_subjects(resolved, doc, methods, field)
    if kind == "score":
        identity = _score_identity(doc, str(resolved))
        document = Document(resolved, kind, doc)
        record = {"path": identity.path, "fingerprint": identity.fingerprint}
        subject = Subject(str(identity.path or resolved), document, _score_metrics(doc), checkpoint=record)
        subject.notes += _score_version_notes(doc, resolved)
        return [subject]
    return [_lm_eval_subject(resolved, doc, field, score, allow_unverified)]


def _run_subjects(path: Path, doc: dict[str, Any], methods: Sequence[str] | None, field: str | None) -> list[Subject]:
    """One subject per method of every field of the run (``field/method`` when the run covers several fields), or of
    ``field`` only."""
    version = read_schema(doc)[1]
    notes = []
    if version != RUN_SCHEMA_VERSION:
        notes.append(f"{path}: results.json schema version {version!r}, this gate knows {RUN_SCHEMA_VERSION}")
    by_field = doc.get("by_field")
    if not isinstance(by_field, dict) or not by_field:  # older results: one field at the top level
        by_field = {doc.get("field") or "?": {"methods": doc.get("methods", {})}}
    if field is not None:
        if field not in by_field:
            raise GateError(f"{path}: --field {field} given, but this run covers {', '.join(map(repr, by_field))}")
        by_field = {field: by_field[field]}
    document = Document(path, "run", doc)
    subjects = []
    for run_field, entry in by_field.items():
        available = entry.get("methods", {}) if isinstance(entry, dict) else None
        if not isinstance(available, dict):
            raise GateError(f'{path}: "methods" of field {run_field!r} must be an object')
        selected = list(dict.fromkeys(methods)) if methods else list(available)
        unknown = [m for m in selected if m not in available]
        if unknown:
            known = ", ".join(available) or "none"
            raise GateError(f"{path}: unknown method {', '.join(map(repr, unknown))} (methods in this run: {known})")
        if not selected:
            raise GateError(f"{path}: the run has no methods to gate")
        location = ("methods",) if "by_field" not in doc else ("by_field", run_field, "methods")
        for name in selected:
            method = available[name]
            if not isinstance(method, dict):
                raise GateError(f"{path}: methods.{name} must be an object, got {type(method).__name__}")
            metrics = {key: _get(method, dotted) for key, dotted in _RUN_METRICS.items()}
            if isinstance(metrics["frag"], Mapping):  # a score.json-style FRAG section
                metrics["frag"] = metrics["frag"].get("frag")
            record = _run_method_identity(path, name, method)
            label = name if len(by_field) == 1 else f"{run_field}/{name}"
            subjects.append(Subject(label, document, metrics, (*location, name), list(notes), checkpoint=record))
            subjects += _seed_subjects(label, document, method, (*location, name), notes)
    return subjects


def _seed_subjects(
    label: str, document: Document, method: Mapping[str, Any], base: tuple[str, ...], notes: Sequence[str]
) -> list[Subject]:
    """One more subject per further unlearning seed of a multi-seed run (``NAME [seed S]``), read from the entry's
    ``across_seeds`` values: every seed is gated, not only the first (whose numbers are the entry's own). A metric
    the run did not summarise across seeds is absent for those subjects, so a criterion on it reads MISSING."""
    across = method.get("across_seeds")
    if not isinstance(across, Mapping) or len(across.get("seeds") or []) < 2:
        return []
    values = across.get("metrics") or {}
    out = []
    for i, seed in enumerate(across["seeds"][1:], start=1):
        metrics: dict[str, Any] = {}
        for key, dotted in _RUN_METRICS.items():
            summary = values.get(dotted) or values.get(dotted.removesuffix(".value"))
            if isinstance(summary, Mapping) and len(summary.get("values") or []) > i:
                metrics[key] = summary["values"][i]
        out.append(Subject(f"{label} [seed {seed}]", document, metrics, base, list(notes), seed=int(seed)))
    return out


def _lm_eval_subject(
    path: Path,
    doc: dict[str, Any],
    field: str | None,
    score: str | os.PathLike[str] | Mapping[str, Any] | None,
    allow_unverified: bool = False,
) -> Subject:
    results = doc["results"]
    fields = _lm_eval_fields(results)
    if field is None:
        if len(fields) > 1:
            raise GateError(f"{path}: results for several fields ({', '.join(fields)}); choose one with --field")
        if not fields:
            raise GateError(f"{path}: no lacuna_<field>_* tasks in these lm-eval results")
        field = fields[0]
    elif field not in fields:
        raise GateError(
            f"{path}: no lacuna_{field}_* tasks in these lm-eval results (fields: {', '.join(fields) or 'none'})"
        )
    metrics: dict[str, Any] = {}
    for task, metric, key in _LM_EVAL_METRICS:
        metrics[key] = metric_value(results.get(f"lacuna_{field}_{task}"), metric)
    root: dict[str, Any] = dict(doc)
    record, notes = None, []
    if score is not None:
        score_doc = score if isinstance(score, Mapping) else _load_score(score)
        score_label = "score.json" if isinstance(score, Mapping) else str(score)
        record = verify_pair(path, doc, score_label, score_doc, allow_unverified=allow_unverified)
        notes = [f"unverified checkpoint: {problem}" for problem in record["problems"]]
        notes += _score_version_notes(score_doc, score_label)
        metrics.update(_score_metrics(score_doc))
        root["score"] = score_doc
    return Subject(_model_name(doc, path), Document(path, "lm-eval", root), metrics, notes=notes, checkpoint=record)
