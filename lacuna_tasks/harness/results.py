"""The one reader of lm-evaluation-harness results: which file a path means, and a metric's value in it.

``lacuna gate``, ``lacuna reversibility`` and :func:`lacuna_tasks.harness.evaluate.evaluate` all read lm-eval results
through this module, so they agree on two rules (docs/ci.md, "Which lm-eval results file"):

* **Several results files.** ``lm_eval --output_path OUT`` writes ``OUT/<model name>/results_<timestamp>.json``
  and adds one file per run, never overwriting. A directory therefore means the *newest* run of its one model:
  the largest ``<timestamp>`` (lm-eval's ISO time, which sorts as text), then the newest modification time. A
  directory holding results of several models is refused (the newest of two models is not "the" result);
  name the model's directory or the file. ``--output_path OUT/x.json`` makes lm-eval write
  ``OUT/x_<timestamp>.json``; a path ``OUT/x.json`` that does not exist means the newest of those.
* **Filters.** lm-eval keys a task's metrics ``"<metric>,<filter>"``. A metric's value is that of the ``none``
  filter (the unfiltered metric, all LACUNA tasks have only it); without one, the value of its only filter; a
  metric under several filters and no ``none`` is ambiguous and has no value. ``<metric>_stderr`` keys are
  standard errors, not metrics.

Lives in ``lacuna_tasks`` because :mod:`lacuna_tasks.harness.evaluate` needs it and may not import ``lacuna_metrics``;
The gate and ``lacuna run`` (:mod:`lacuna_unlearn.bench`) read through it too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_GLOB",
    "LmEvalResultsError",
    "find_lm_eval_results",
    "metric_value",
    "read_lm_eval_results",
    "resolve_lm_eval_results",
    "task_metrics",
]

#: The aggregated-results files lm-eval writes under ``--output_path`` (samples go to ``samples_*.jsonl``).
RESULTS_GLOB = "results_*.json"
#: The filter lm-eval reports for an unfiltered metric.
NO_FILTER = "none"


class LmEvalResultsError(ValueError):
    """lm-eval results that cannot be read as such: several models, malformed JSON, no ``results`` object, an
    ambiguous or absent metric. The message names the file or directory at fault."""


def _newest(files: list[Path], stamp_from: int) -> Path:
    """The newest of ``files`` by the timestamp text from ``stamp_from`` in the name, then mtime, then path."""
    return max(files, key=lambda p: (p.stem[stamp_from:], p.stat().st_mtime, str(p)))


def find_lm_eval_results(directory: str | os.PathLike[str]) -> Path:
    """The newest ``results_*.json`` under an lm-eval ``--output_path`` directory (docs/ci.md).

    The files may sit in the directory itself (it is the model's directory) or below it; they must all belong
    to one model directory. FileNotFoundError when there is none, :class:`LmEvalResultsError` when several
    model directories hold results.
    """
    directory = Path(directory)
    found = [p for p in directory.rglob(RESULTS_GLOB) if p.is_file()]
    if not found:
        raise FileNotFoundError(f"{directory}: no lm-eval {RESULTS_GLOB} under this directory")
    models = sorted({p.parent for p in found})
    if len(models) > 1:
        shown = ", ".join(str(m) for m in models)
        raise LmEvalResultsError(
            f"{directory}: lm-eval results of {len(models)} models ({shown}); give the directory of one model "
            "or one results file"
        )
    return _newest(found, len("results_"))


def resolve_lm_eval_results(path: str | os.PathLike[str]) -> Path:
    """The results file ``path`` means: itself, the newest run under a directory (:func:`find_lm_eval_results`),
    or, for lm-eval's ``--output_path OUT/x.json`` (written as ``OUT/x_<timestamp>.json``), the newest ``x_*.json``.
    FileNotFoundError when there is nothing there."""
    path = Path(path)
    if path.is_dir():
        return find_lm_eval_results(path)
    if path.exists():
        return path
    if path.suffix == ".json" and path.parent.is_dir():
        stamped = [p for p in path.parent.glob(f"{path.stem}_*.json") if p.is_file()]
        if stamped:
            return _newest(stamped, len(path.stem) + 1)
    raise FileNotFoundError(f"{path}: no such file or directory")


def read_lm_eval_results(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """``(file, parsed JSON)`` of the lm-eval results ``path`` means (:func:`resolve_lm_eval_results`).

    :class:`LmEvalResultsError` naming the file when it is not UTF-8 JSON or has no ``results`` object.
    """
    file = resolve_lm_eval_results(path)
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise LmEvalResultsError(f"{file}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise LmEvalResultsError(f"{file}: malformed JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise LmEvalResultsError(f"{file}: not an lm-eval results JSON (no 'results' object)")
    return file, doc


def metric_value(entry: Any, metric: str, filter_name: str | None = None) -> Any:
    """``metric`` of one task entry of ``results``: under ``filter_name`` when given, else the ``none`` filter,
    else the metric's only filter; None when absent or ambiguous (several filters, none of them ``none``)."""
    if not isinstance(entry, Mapping):
        return None
    if filter_name is not None:
        return entry.get(f"{metric},{filter_name}")
    if f"{metric},{NO_FILTER}" in entry:
        return entry[f"{metric},{NO_FILTER}"]
    keys = [k for k in entry if isinstance(k, str) and k.startswith(f"{metric},")]
    return entry[keys[0]] if len(keys) == 1 else None


def task_metrics(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Every metric of one task entry by bare name (``leak_rate``), each read by :func:`metric_value`; standard
    errors and ambiguous metrics (several filters, none of them ``none``) are left out."""
    filters: dict[str, list[str]] = {}
    for key in entry:
        if isinstance(key, str) and "," in key and "stderr" not in key:
            name, _, filter_name = key.partition(",")
            filters.setdefault(name, []).append(filter_name)
    return {name: metric_value(entry, name) for name, names in filters.items() if NO_FILTER in names or len(names) == 1}
