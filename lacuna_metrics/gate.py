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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "METRICS",
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

RUN_SCHEMA = "lacuna-bench/run"
RUN_SCHEMA_VERSION = 1
SCORE_SCHEMA = "lacuna-bench/score"
SCORE_SCHEMA_VERSION = 2  #: the newest score.json this gate knows
_FINGERPRINTED_SCORE_VERSION = 2  # the first whose fingerprints cover every byte of the weights
GATE_SCHEMA = "lacuna-bench/gate"
GATE_SCHEMA_VERSION = 1

PASS, FAIL, MISSING = "PASS", "FAIL", "MISSING"

#: Metric keys every subject may carry (usable in ``--check`` as bare names), with their meaning.
METRICS: dict[str, str] = {
    "forget_leak": "forget QA leak rate (lower is better)",
    "retain_accuracy": "retain QA accuracy",
    "j_w": "worst-case leak J_W over paraphrase, ICR and QA probes",
    "j_p": "worst-case leak over paraphrases J_P",
    "j_icr": "worst-case leak over in-context retrieval J_ICR",
    "em": "exact-match memorization",
    "es": "extraction strength",
    "prob": "answer probability",
    "success_at_n": "Success@N of the extraction probe (after the relearning attack for lacuna run)",
    "success_at_n_unlearned": "Success@N before the relearning attack (lacuna run)",
    "auc_forget": "best localization AUC(F)",
    "auc_unified": "best unified localization AUC",
    "auc_forget_vs_retain": "best forget-vs-retain localization AUC",
    "auc_forget_calibrated": "best localization AUC(F) over the null-calibrated families",
    "auc_forget_lift": "largest AUC(F) minus null AUC over every family (lift)",
    "retain_eval_accuracy": "held-out retain accuracy (people no unlearning loss saw)",
    "crossfield_accuracy": "cross-field retention (the forget people's other fields)",
    "neutral_ppl_ratio": "neutral-text word perplexity after / before unlearning (held-out prose)",
    "frag": "FRAG (forget/retain alignment of the update)",
    "l2": "global L2 norm of the weight update",
}

#: Built-in flags: (option, criterion name, metric key, comparison, help).
_BUILTINS: tuple[tuple[str, str, str, str, str], ...] = (
    ("--max-leak", "max-leak", "forget_leak", "<=", "forget QA leak rate <= X"),
    ("--min-retain", "min-retain", "retain_accuracy", ">=", "retain QA accuracy >= X"),
    ("--max-jw", "max-jw", "j_w", "<=", "worst-case leak J_W <= X"),
    ("--min-auc", "min-auc", "auc_forget", ">=", "best localization AUC(F) >= X (needs score.json for lm-eval input)"),
    ("--min-auc-unified", "min-auc-unified", "auc_unified", ">=", "best unified localization AUC >= X"),
    ("--min-lift", "min-lift", "auc_forget_lift", ">=", "AUC(F) lift over the null updates >= X (docs/scoring.md)"),
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

#: lm-eval task (suffix after ``lacuna_<field>_``), metric and our metric key.
_LM_EVAL_METRICS: tuple[tuple[str, str, str], ...] = (
    ("forget_qa", "leak_rate", "forget_leak"),
    ("retain_qa", "accuracy", "retain_accuracy"),
    ("retain_eval_qa", "accuracy", "retain_eval_accuracy"),
    ("crossfield_qa", "accuracy", "crossfield_accuracy"),
    ("forget_worstcase", "j_w", "j_w"),
    ("forget_worstcase", "j_p", "j_p"),
    ("forget_worstcase", "j_icr", "j_icr"),
    ("extraction", "success_at_n", "success_at_n"),
)

#: Our metric keys inside a ``results.json`` method entry (dotted paths relative to ``methods.<name>``).
_RUN_METRICS: dict[str, str] = {
    "forget_leak": "behaviour.forget_leak",
    "retain_accuracy": "behaviour.retain_accuracy",
    "j_w": "behaviour.j_w",
    "j_p": "behaviour.j_p",
    "j_icr": "behaviour.j_icr",
    "em": "behaviour.em",
    "es": "behaviour.es",
    "prob": "behaviour.prob",
    "success_at_n": "attack.success_at_n_relearned",
    "success_at_n_unlearned": "attack.success_at_n_unlearned",
    "auc_forget": "auc.forget.best.value",
    "auc_unified": "auc.unified.best.value",
    "auc_forget_vs_retain": "auc.forget_vs_retain.best.value",
    "auc_forget_calibrated": "auc.forget.calibrated_best.value",
    "auc_forget_lift": "auc.forget.best_lift.value",
    "retain_eval_accuracy": "behaviour.retain_eval_accuracy",
    "crossfield_accuracy": "behaviour.crossfield_accuracy",
    "neutral_ppl_ratio": "behaviour.neutral_ppl_ratio",
    "frag": "frag",
    "l2": "l2",
}

#: Our metric keys inside a ``score.json``.
_SCORE_METRICS: dict[str, str] = {
    "auc_forget": "auc.forget.best.value",
    "auc_unified": "auc.unified.best.value",
    "auc_forget_vs_retain": "auc.forget_vs_retain.best.value",
    "auc_forget_calibrated": "null_calibration.targets.forget.best.value",
    "auc_forget_lift": "null_calibration.targets.forget.best_lift.value",
    "frag": "frag.frag",
    "l2": "distance.l2",
}

_TASK_RE = re.compile(
    r"^lacuna_(?P<field>[a-z0-9_]+?)_(?:(?:forget|retain)_(?:qa|paraphrase|icr|worstcase|memorization)|extraction)$"
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
        if math.isnan(self.threshold):
            raise GateError(f"criterion {self.name!r}: threshold is NaN")

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


# --------------------------------------------------------------------------------------------- input


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
    if not isinstance(doc, dict):
        return None
    schema = doc.get("schema")
    if isinstance(schema, dict) and schema.get("name") == RUN_SCHEMA:
        return "run"
    if schema == SCORE_SCHEMA:
        return "score"
    if isinstance(doc.get("results"), dict) and "configs" in doc:
        return "lm-eval"
    return None


def find_lm_eval_results(directory: str | os.PathLike[str]) -> Path:
    """The newest ``results_*.json`` anywhere under an lm-eval ``--output_path`` directory.

    "Newest" is the timestamp lm-eval puts in the file name (then modification time).
    """
    directory = Path(directory)
    found = [p for p in directory.rglob("results_*.json") if p.is_file()]
    if not found:
        raise GateError(f"{directory}: no lm-eval results_*.json under this directory (and no results.json)")
    return max(found, key=lambda p: (p.stem[len("results_") :], p.stat().st_mtime, str(p)))


def _resolve_input(path: Path) -> Path:
    """The results file behind ``path``: itself, ``DIR/results.json`` of a run, the newest lm-eval
    ``results_*.json`` under a directory, or, for lm-eval's ``--output_path out/x.json`` (written as
    ``out/x_<timestamp>.json``), the newest ``x_*.json``."""
    if path.is_dir():
        run_file = path / "results.json"
        if run_file.is_file() and _kind(_read_json(run_file)) == "run":
            return run_file
        return find_lm_eval_results(path)
    if not path.exists():
        stamped = [p for p in path.parent.glob(f"{path.stem}_*.json") if p.is_file()] if path.suffix == ".json" else []
        if not stamped:
            raise GateError(f"{path}: no such file or directory")
        return max(stamped, key=lambda p: (p.stem[len(path.stem) + 1 :], p.stat().st_mtime, str(p)))
    return path


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


def _lm_eval_value(entry: Any, metric: str) -> Any:
    """``metric`` from one lm-eval task entry: ``"<metric>,none"``, else the one ``"<metric>,<filter>"``."""
    if not isinstance(entry, Mapping):
        return None
    if f"{metric},none" in entry:
        return entry[f"{metric},none"]
    keys = [k for k in entry if isinstance(k, str) and k.startswith(f"{metric},")]
    return entry[keys[0]] if len(keys) == 1 else None


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
    version = doc["schema"].get("version")
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
    return subjects


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
        metrics[key] = _lm_eval_value(results.get(f"lacuna_{field}_{task}"), metric)
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


# ---------------------------------------------------------------------------------- checkpoint identity

_STALE_SLACK_SECONDS = 2.0  # timestamp granularity and clock slack for "weights written after the evaluation"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$")
#: ``model_args`` that change the evaluated weights beyond ``pretrained``: not a checkpoint directory.
_ADAPTER_ARGS = ("peft", "delta", "gguf_file")


@dataclass
class Identity:
    """The checkpoint a results file describes: its path and content fingerprint as far as known, and why
    it cannot be verified (``problems``, empty when verified)."""

    path: str | None
    fingerprint: str | None
    problems: list[str] = dataclasses.field(default_factory=list)


#: Fingerprints already computed during one gate run (``_collect_subjects``), by resolved directory.
_MEMO: dict[str, str] | None = None


def _fingerprint(directory: Path, what: str) -> tuple[str, list[Path]]:
    """Content fingerprint (:meth:`Checkpoint.fingerprint`) and weight files of ``directory``; GateError if unreadable.

    Within one gate run a checkpoint named by several inputs is hashed once.
    """
    from lacuna_metrics.checkpoints import Checkpoint, CheckpointError

    try:
        ckpt = Checkpoint(directory)
        key = str(directory)
        fingerprint = _MEMO.get(key) if _MEMO is not None else None
        if fingerprint is None:
            fingerprint = ckpt.fingerprint()
            if _MEMO is not None:
                _MEMO[key] = fingerprint
        return fingerprint, ckpt.files
    except (CheckpointError, OSError) as exc:
        detail = " ".join(str(exc).split())
        raise GateError(f"{directory}: cannot fingerprint {what}: {detail}") from None


def _short(fingerprint: str | None) -> str:
    return "no fingerprint" if not fingerprint else fingerprint[: len("sha256:") + 12] + "…"


def _model_args(doc: Mapping[str, Any]) -> dict[str, str]:
    """lm-eval's ``config.model_args`` (a ``k=v,k=v`` string or a dict) as a dict of strings."""
    config = doc.get("config")
    args = config.get("model_args") if isinstance(config, Mapping) else None
    if isinstance(args, Mapping):
        return {str(k): str(v) for k, v in args.items() if v is not None}
    out: dict[str, str] = {}
    if isinstance(args, str):
        for part in args.split(","):
            key, sep, value = part.partition("=")
            if sep and key.strip():
                out[key.strip()] = value.strip()
    return out


def _hub_snapshot(name: str, args: Mapping[str, str], doc: Mapping[str, Any]) -> tuple[Path | None, str]:
    """The local Hugging Face cache snapshot of hub model ``name`` at the commit lm-eval recorded, or why not."""
    if not _REPO_ID_RE.match(name) or name.startswith(".") or ".." in name:
        return None, f"lm-eval evaluated {name}, which does not exist here (run the gate where the checkpoint is)"
    config = doc.get("config") if isinstance(doc.get("config"), Mapping) else {}
    pins = (config.get("model_sha"), config.get("model_revision"), args.get("revision"))
    commit = next((c for c in pins if isinstance(c, str) and _COMMIT_RE.match(c)), None)
    if commit is None:
        return None, (
            f"lm-eval evaluated {name}, which is no local directory here, and the results pin no hub commit "
            "(config.model_sha) to find that model in the Hugging Face cache"
        )
    try:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    except ImportError:
        return None, f"lm-eval evaluated the hub model {name}@{commit[:12]} and huggingface_hub is not installed"
    snapshot = cache / ("models--" + name.replace("/", "--")) / "snapshots" / commit
    if args.get("subfolder"):
        snapshot = snapshot / args["subfolder"]
    if not snapshot.is_dir():
        return None, f"lm-eval evaluated the hub model {name}@{commit[:12]}, which is not in the local cache {cache}"
    return snapshot, ""


def _lm_eval_identity(path: Path, doc: Mapping[str, Any]) -> Identity:
    """The checkpoint lm-eval results describe: ``pretrained=`` of ``config.model_args`` (a relative path is
    taken from the current directory; a hub id from the local HF cache at the recorded commit), fingerprinted
    as it is now. A local checkpoint whose weight files are newer than the evaluation (``date``) is unverified."""
    args = _model_args(doc)
    pretrained = args.get("pretrained")
    if not pretrained:
        return Identity(
            None, None, [f"{path}: these lm-eval results name no checkpoint (no pretrained= in model_args)"]
        )
    adapters = [f"{k}={args[k]}" for k in _ADAPTER_ARGS if args.get(k)]
    if adapters:
        return Identity(
            pretrained,
            None,
            [
                f"{path}: lm-eval evaluated {pretrained} with {', '.join(adapters)}, which is not one checkpoint directory"
            ],
        )
    local = Path(pretrained).expanduser()
    if args.get("subfolder"):
        local = local / args["subfolder"]
    hub = not local.exists()
    if hub:
        snapshot, problem = _hub_snapshot(pretrained, args, doc)
        if snapshot is None:
            return Identity(pretrained, None, [f"{path}: {problem}"])
        directory = snapshot
    else:
        directory = local.resolve()
    fingerprint, files = _fingerprint(directory, f"the checkpoint lm-eval evaluated ({path})")
    problems = []
    started = doc.get("date")
    if not hub and _is_number(started) and files:  # hub snapshots are immutable; their mtime is the download
        newest = max(f.stat().st_mtime for f in files)
        if newest > started + _STALE_SLACK_SECONDS:
            problems.append(
                f"{path}: {directory} was rewritten after lm-eval evaluated it (weights modified {_iso(newest)}, "
                f"evaluation started {_iso(started)}), so these results may describe an earlier checkpoint"
            )
    return Identity(str(directory), fingerprint, problems)


def _iso(timestamp: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc).isoformat(timespec="seconds")


def _score_version_notes(score: Mapping[str, Any], label: str | Path) -> list[str]:
    version = score.get("schema_version")
    if _is_number(version) and version > SCORE_SCHEMA_VERSION:
        return [f"{label}: score.json schema_version {version}, this gate knows {SCORE_SCHEMA_VERSION}"]
    return []


def _score_identity(score: Mapping[str, Any], label: str) -> Identity:
    """The ``after`` checkpoint a score.json recorded; unverified unless schema 2+ with a content fingerprint."""
    version = score.get("schema_version")
    after = _get(score, "manifest.inputs.after")
    path = after.get("path") if isinstance(after, Mapping) else None
    fingerprint = after.get("fingerprint") if isinstance(after, Mapping) else None
    path = str(path) if path is not None else None
    newer = _is_number(version) and version >= _FINGERPRINTED_SCORE_VERSION
    if not newer or not isinstance(fingerprint, str) or not fingerprint.startswith("sha256:"):
        return Identity(
            path,
            None,
            [
                f"{label}: score.json schema_version {version!r} does not record the content fingerprint of the "
                f"checkpoint it scored; re-score it (lacuna score --after {path or 'CKPT'} ...) to get one"
            ],
        )
    return Identity(path, fingerprint)


def verify_pair(
    results: Path,
    doc: Mapping[str, Any],
    score_label: str,
    score: Mapping[str, Any],
    *,
    allow_unverified: bool = False,
) -> dict[str, Any]:
    """Check that lm-eval ``results`` (parsed: ``doc``) and a score.json describe the same checkpoint.

    Refuses (GateError) when both fingerprints are known and differ, whatever ``allow_unverified``; when the
    pair cannot be verified, refuses unless ``allow_unverified``, which then still compares the lm-eval
    checkpoint with what is now at an old score's ``after`` path. Returns the JSON-ready record: ``path`` and
    ``fingerprint`` of the evaluated checkpoint, the score's ``after``, ``verified`` and ``problems``.
    """
    evaluated = _lm_eval_identity(results, doc)
    scored = _score_identity(score, score_label)

    def mismatch(score_fp: str | None, how: str) -> GateError:
        return GateError(
            f"checkpoint mismatch: {results} are lm-eval results of {evaluated.path} ({_short(evaluated.fingerprint)}), "
            f"but {score_label} {how} {scored.path} ({_short(score_fp)}); score the evaluated checkpoint "
            f"(lacuna score --after {evaluated.path} ...) or give the score.json of {evaluated.path}"
        )

    if evaluated.fingerprint and scored.fingerprint and evaluated.fingerprint != scored.fingerprint:
        raise mismatch(scored.fingerprint, "scored")
    problems = evaluated.problems + scored.problems
    if problems and not allow_unverified:
        raise GateError("; ".join(problems) + "; or pass --allow-unverified to gate the pair anyway")
    if evaluated.fingerprint and scored.fingerprint is None and scored.path and Path(scored.path).exists():
        now, _ = _fingerprint(Path(scored.path), f"the score's after checkpoint ({score_label})")
        if now != evaluated.fingerprint:  # not what was scored, but what is there now: still a contradiction
            raise mismatch(now, "was computed for the checkpoint at")
    return {
        "path": evaluated.path,
        "fingerprint": evaluated.fingerprint,
        "score": score_label,
        "score_after": {"path": scored.path, "fingerprint": scored.fingerprint},
        "verified": not problems,
        "problems": problems,
    }


def _run_method_identity(path: Path, name: str, entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """``methods.NAME.checkpoint`` (the model evaluated and attacked) against ``methods.NAME.score_checkpoint``
    (the score's ``after``), when the run recorded them: results of two checkpoints in one entry are refused."""
    evaluated, scored = entry.get("checkpoint"), entry.get("score_checkpoint")
    if not isinstance(evaluated, Mapping):
        return None
    record = {"path": evaluated.get("path"), "fingerprint": evaluated.get("fingerprint")}
    if isinstance(scored, Mapping):
        a, b = evaluated.get("fingerprint"), scored.get("fingerprint")
        if isinstance(a, str) and isinstance(b, str) and a != b:
            raise GateError(
                f"checkpoint mismatch: {path}: method {name} was evaluated on {evaluated.get('path')} ({_short(a)}) "
                f"but scored on {scored.get('path')} ({_short(b)}); re-run lacuna run (a stale stage?)"
            )
        record["score_after"] = {"path": scored.get("path"), "fingerprint": b}
    return record


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
    if math.isnan(threshold):
        raise GateError(f"bad --check {text!r}: threshold is NaN")
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
    if math.isnan(value):
        return verdict(FAIL, f"{where} is NaN")
    shown = f"{criterion.metric} = {_fmt(value, criterion.threshold)}"
    if criterion.holds(value):
        return verdict(PASS, f"{shown} {criterion.op} {_fmt(criterion.threshold)}")
    return verdict(FAIL, f"{shown}, required {criterion.op} {_fmt(criterion.threshold)}")


def evaluate(subjects: Sequence[Subject], criteria: Sequence[Criterion]) -> list[Verdict]:
    """Check every criterion against every subject (criteria outer, subjects inner).

    A metric-key criterion reads ``subject.metrics``. A dotted path is absolute when its first
    segment is a top-level key of the input file: ``methods.NAME.…`` gives one verdict for method
    NAME, ``methods.*.…`` one per selected method, any other absolute path one verdict per run
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
            members = [s for s in subjects if s.document is doc]
            root = doc.root
            if doc.kind == "run" and segments[0] == "methods" and len(segments) > 1:
                if segments[1] == "*":
                    for s in members:
                        found, value = _lookup(root, [*s.base, *segments[2:]])
                        verdicts.append(_judge(c, s.name, doc.path, found, value, c.metric))
                else:
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


# --------------------------------------------------------------------------------------------- output


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


def format_table(verdicts: Sequence[Verdict], *, allow_missing: bool = False) -> str:
    """The verdicts as an aligned text table with a one-line summary."""
    header = ("criterion", "metric", "subject", "measured", "threshold", "verdict")
    rows = [
        (
            v.criterion.name if not v.criterion.name.startswith("check ") else "check",
            v.criterion.metric,
            v.subject,
            _fmt(v.value, v.criterion.threshold),
            f"{v.criterion.op} {_fmt(v.criterion.threshold)}",
            v.status + (" (allowed)" if v.status == MISSING and allow_missing else ""),
        )
        for v in verdicts
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = {s: sum(v.status == s for v in verdicts) for s in (PASS, FAIL, MISSING)}
    code = exit_code(verdicts, allow_missing=allow_missing)
    lines.append("")
    lines.append(
        f"{'PASSED' if code == 0 else 'FAILED'}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[MISSING]} missing"
        + (" (missing allowed)" if allow_missing and counts[MISSING] else "")
    )
    return "\n".join(lines)


def write_junit(path: str | os.PathLike[str], verdicts: Sequence[Verdict], *, allow_missing: bool = False) -> Path:
    """Write the verdicts as JUnit XML atomically: one testcase per criterion × subject (class
    ``lacuna.gate.<subject, sanitized>``), a ``<failure>`` for FAIL (and MISSING unless
    ``allow_missing``, else ``<skipped>``)."""
    from lacuna_metrics.manifest import write_text

    failures = sum(v.status == FAIL or (v.status == MISSING and not allow_missing) for v in verdicts)
    skipped = sum(v.status == MISSING and allow_missing for v in verdicts)
    attrs = {"name": "lacuna gate", "tests": str(len(verdicts)), "failures": str(failures), "errors": "0"}
    suites = ET.Element("testsuites", attrs)
    suite = ET.SubElement(suites, "testsuite", {**attrs, "skipped": str(skipped)})
    for v in verdicts:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                # reporters split class names on dots: keep the subject (often a path) in one segment
                "classname": "lacuna.gate." + (re.sub(r"[^\w-]+", "_", v.subject).strip("_") or "subject"),
                "name": f"{v.subject}: {v.criterion.metric} {v.criterion.op} {_fmt(v.criterion.threshold)}",
                "file": v.source,
            },
        )
        if v.status == FAIL or (v.status == MISSING and not allow_missing):
            failure = ET.SubElement(case, "failure", {"message": v.message, "type": v.status})
            failure.text = f"{v.criterion.name} on {v.subject}: {v.message}"
        elif v.status == MISSING:
            ET.SubElement(case, "skipped", {"message": v.message})
        else:
            ET.SubElement(case, "system-out").text = v.message
    ET.indent(suites)
    return write_text(path, '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")


def verdicts_json(
    verdicts: Sequence[Verdict], subjects: Sequence[Subject], *, allow_missing: bool = False
) -> dict[str, Any]:
    """The verdicts as a JSON-ready dict (non-finite values become null, with ``value_text``)."""
    criteria: list[Criterion] = list(dict.fromkeys(v.criterion for v in verdicts))
    sources = list(dict.fromkeys(str(s.document.path) for s in subjects))
    code = exit_code(verdicts, allow_missing=allow_missing)

    def value(v: Verdict) -> Any:
        n = v.number
        return n if n is not None and math.isfinite(n) else None

    return {
        "schema": {"name": GATE_SCHEMA, "version": GATE_SCHEMA_VERSION},
        "passed": code == 0,
        "exit_code": code,
        "allow_missing": allow_missing,
        "inputs": [_input_json(p, [s for s in subjects if str(s.document.path) == p]) for p in sources],
        "criteria": [
            {
                "name": c.name,
                "metric": c.metric,
                "op": c.op,
                "threshold": c.threshold if math.isfinite(c.threshold) else str(c.threshold),
            }
            for c in criteria
        ],
        "counts": {s.lower(): sum(v.status == s for v in verdicts) for s in (PASS, FAIL, MISSING)},
        "verdicts": [
            {
                "criterion": v.criterion.name,
                "metric": v.criterion.metric,
                "op": v.criterion.op,
                "threshold": v.criterion.threshold
                if math.isfinite(v.criterion.threshold)
                else str(v.criterion.threshold),
                "subject": v.subject,
                "source": v.source,
                "value": value(v),
                "value_text": None if v.value is None else _fmt(v.value),
                "status": v.status,
                "message": v.message,
            }
            for v in verdicts
        ],
    }


def _input_json(path: str, members: Sequence[Subject]) -> dict[str, Any]:
    """One input of the JSON report: path, kind and the checkpoint(s) it describes."""
    kind = members[0].document.kind
    entry: dict[str, Any] = {"path": path, "kind": kind}
    if kind == "run":
        recorded = {s.name: s.checkpoint for s in members if s.checkpoint is not None}
        if recorded:
            entry["checkpoints"] = recorded
    elif members[0].checkpoint is not None:
        entry["checkpoint"] = members[0].checkpoint
    return entry


# ------------------------------------------------------------------------------------------------ CLI


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("threshold is NaN")
    return value


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
    global _MEMO
    _MEMO = {}
    try:
        for p, k in zip(paths, kinds, strict=True):
            score = None
            if k == "lm-eval" and scores:
                score = scores[i] if len(scores) > 1 else scores[0]
                i += 1
            method = args.method if k == "run" else None
            subjects += load_subjects(p, methods=method, field=args.field, score=score, allow_unverified=allow)
    finally:
        _MEMO = None
    return subjects


def _check_writable(flag: str, path: Path) -> None:
    """A report file that cannot be written fails before any input is read (not after the table is printed)."""
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
        print(f"lacuna gate: warning: {note}", file=sys.stderr)
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
            from lacuna_metrics.manifest import write_json

            write_json(args.json_out, verdicts_json(verdicts, subjects, allow_missing=args.allow_missing))
    except OSError as exc:
        print(f"lacuna gate: error: cannot write report: {exc}", file=sys.stderr)
        return 2
    return exit_code(verdicts, allow_missing=args.allow_missing)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lacuna_metrics.gate ...`` (the same as ``lacuna gate ...``)."""
    parser = argparse.ArgumentParser(prog="lacuna gate")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
