"""Neutral-text perplexity: the lm-eval task ``lacuna_neutral_ppl`` and the after/before ratio.

A testbed holds a seeded slice of its neutral text that was never trained on, ``data/neutral_heldout.jsonl``
(one ``{"text": ...}`` per line, written by ``lacuna_unlearn.testbed.build.write_neutral_heldout``). Unlearning that
damages the model's general language ability raises the perplexity of that text; a precise method leaves it
where it was. The task scores every document with lm-eval's ``loglikelihood_rolling`` (the whole text, in
windows of the model's context length, no prompt) and reports lm-eval's standard perplexity metrics, as its
``wikitext`` task does:

* ``word_perplexity`` = exp(- sum of log-likelihoods / sum of words), words = ``len(text.split())``;
* ``byte_perplexity`` = exp(- sum of log-likelihoods / sum of UTF-8 bytes);
* ``bits_per_byte`` = - sum of log-likelihoods / sum of UTF-8 bytes / ln 2.

The data directory is the one every LACUNA task reads (``--metadata '{"lacuna_data": DIR}'``, else
``$LACUNA_DATA``); a testbed directory works too (its ``data/`` is read). Data without the file (the bundled
dataset, ``lacuna data generate`` output, testbeds built before the held-out slice existed) is an error that
names the file: a perplexity probe over nothing would be a silent zero. The file's SHA-256 is recorded in the
task's config (``metadata.lacuna_neutral_heldout``), so two runs can be checked to have read the same text.

:func:`perplexity_ratio` reads two lm-eval results (before and after unlearning) and returns
after / before of the word perplexity: > 1 means the text became less likely. :func:`word_perplexity_ratio` is the
ratio rule itself, for callers that already hold the two numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_tasks.harness.hooks import data_errors_in_one_line
from lacuna_tasks.harness.results import LmEvalResultsError, metric_value, read_lm_eval_results
from lacuna_tasks.loader import BUNDLED_DIR, BUNDLED_NAME, jsonl_lines, resolve_source
from lacuna_tasks.schema import NEUTRAL_HELDOUT_FILE, NEUTRAL_PPL_TASK, LacunaDataError

__all__ = [
    "NEUTRAL_HELDOUT_FILE",
    "PPL_METRICS",
    "TASK",
    "load_neutral_docs",
    "neutral_heldout_path",
    "perplexity_ratio",
    "process_results",
    "read_neutral_heldout",
    "word_perplexity_ratio",
]

#: The task's name in lm-eval and the file the testbed builder writes into ``data/`` (defined in schema).
TASK = NEUTRAL_PPL_TASK
#: Metric names as lm-eval reports them (results key ``<metric>,none``).
PPL_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
#: Key of the task config's metadata that records which file was read.
PROVENANCE_KEY = "lacuna_neutral_heldout"


def neutral_heldout_path(source: str | os.PathLike[str]) -> Path:
    """Where ``source`` (a data directory or a testbed directory) keeps the held-out neutral text.

    Raises :class:`LacunaDataError` naming the file when it is not there.
    """
    name = str(source)
    root = BUNDLED_DIR if name == BUNDLED_NAME else Path(name).expanduser()
    if not root.is_dir():
        raise LacunaDataError(
            f"LACUNA data path {str(root)!r} is not a directory (set via --metadata lacuna_data or $LACUNA_DATA)"
        )
    for candidate in (root / NEUTRAL_HELDOUT_FILE, root / "data" / NEUTRAL_HELDOUT_FILE):
        if candidate.is_file():
            return candidate.resolve()
    shown = "the bundled dataset" if name == BUNDLED_NAME else str(root)
    raise LacunaDataError(
        f"{shown}: no {NEUTRAL_HELDOUT_FILE} (looked for {root / NEUTRAL_HELDOUT_FILE}); {TASK} reads the held-out "
        "neutral text that `lacuna build-testbed` writes into a testbed's data/ (pass that directory as "
        "--metadata lacuna_data); data from `lacuna data generate`, the bundled dataset and testbeds built "
        "before the held-out slice existed have none"
    )


def read_neutral_heldout(path: str | os.PathLike[str]) -> list[str]:
    """The texts of a ``neutral_heldout.jsonl``; bad lines raise :class:`LacunaDataError` naming file and line."""
    file = Path(path)
    texts: list[str] = []
    for lineno, row in jsonl_lines(file):
        text = row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise LacunaDataError(f"{file}:{lineno}: expected an object with a string 'text'")
        if not text.split():
            raise LacunaDataError(f"{file}:{lineno}: empty 'text' (nothing to score)")
        texts.append(text)
    if not texts:
        raise LacunaDataError(
            f"{file}: holds no documents (a testbed built with neutral_heldout=0 has no held-out neutral text)"
        )
    return texts


def load_neutral_docs(**metadata: Any):
    """``custom_dataset`` entry point: one document per held-out text, in file order, with the file's provenance.

    Under the ``lm_eval`` command a missing or bad file ends the run with one line naming it (exit 2).
    """
    import datasets

    with data_errors_in_one_line():
        path = neutral_heldout_path(resolve_source(metadata))
        texts = read_neutral_heldout(path)
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    provenance = {"file": str(path), "fingerprint": digest, "documents": len(texts)}
    info = datasets.DatasetInfo(description=json.dumps({PROVENANCE_KEY: provenance}))
    docs = [{"doc_id": i, "text": text} for i, text in enumerate(texts)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs, info=info)})


def process_results(doc: Mapping[str, Any], results: Any) -> dict[str, tuple[float, int]]:
    """lm-eval's perplexity items for one document: (log-likelihood, words) and (log-likelihood, bytes)."""
    (loglikelihood,) = results
    text = doc["text"]
    words = len(text.split())
    n_bytes = len(text.encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, n_bytes),
        "bits_per_byte": (loglikelihood, n_bytes),
    }


# --------------------------------------------------------------------------- after / before


def perplexity_ratio(
    before: Mapping[str, Any] | str | os.PathLike[str],
    after: Mapping[str, Any] | str | os.PathLike[str],
    *,
    metric: str = "word_perplexity",
) -> float:
    """after / before of ``metric`` of :data:`TASK` in two lm-eval results (:func:`word_perplexity_ratio`).

    Each argument is a results file written by ``lm_eval --output_path``, its parsed JSON, or the output of
    :func:`lacuna_tasks.harness.evaluate.evaluate` (metric keys without the ``,none`` filter suffix). When both
    results record which held-out file they read (the task config's ``metadata.lacuna_neutral_heldout``),
    the fingerprints must agree: a ratio over two different texts means nothing.
    """
    if metric not in PPL_METRICS:
        raise ValueError(f"unknown perplexity metric {metric!r}; expected one of {PPL_METRICS}")
    b, a = _results(before, "before"), _results(after, "after")
    fb, fa = _fingerprint(b), _fingerprint(a)
    if fb is not None and fa is not None and fb != fa:
        raise LacunaDataError(f"{TASK}: before and after read different held-out text ({fb} vs {fa})")
    ratio = word_perplexity_ratio(_metric(a, metric, "after"), _metric(b, metric, "before"))
    if ratio is None:  # unreachable: _metric returns finite positive numbers only
        raise ValueError(f"{TASK}: no {metric} ratio")
    return ratio


def word_perplexity_ratio(after: float | None, before: float | None) -> float | None:
    """after / before of a perplexity, rounded to 6 decimals: > 1 means the text became less likely.

    None when either value is missing or ``before`` is 0 (no ratio to report). The one rule for the ratio:
    :func:`perplexity_ratio` (two lm-eval results files) and ``lacuna run``'s ``behaviour.neutral_ppl_ratio``
    (the baseline's and a method's ``neutral_word_perplexity``, docs/tasks.md) both go through it.
    """
    if not before or after is None:
        return None
    return round(after / before, 6)


def _results(value: Mapping[str, Any] | str | os.PathLike[str], which: str) -> Mapping[str, Any]:
    """An lm-eval results mapping, or the one a path means (read by the shared reader, docs/ci.md)."""
    if isinstance(value, Mapping):
        return value
    try:
        return read_lm_eval_results(value)[1]
    except FileNotFoundError:
        raise FileNotFoundError(f"{which}: no lm-eval results file {value}") from None
    except LmEvalResultsError as exc:
        raise ValueError(f"{which}: {exc}") from None


def _metric(results: Mapping[str, Any], metric: str, which: str) -> float:
    task = (results.get("results") or {}).get(TASK)
    if task is None:
        raise KeyError(f"{which}: no results for task {TASK!r} (run lm_eval with --tasks {TASK})")
    value = metric_value(task, metric)
    if value is None:
        value = task.get(metric)  # lacuna_tasks.harness.evaluate returns bare metric names
    if value is None:
        raise KeyError(f"{which}: task {TASK!r} reports no {metric!r} (keys: {sorted(task)})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{which}: {TASK} {metric} = {value!r}; expected a finite positive number")
    return float(value)


def _fingerprint(results: Mapping[str, Any]) -> str | None:
    configs = results.get("configs") or {}
    provenance = ((configs.get(TASK) or {}).get("metadata") or {}).get(PROVENANCE_KEY)
    return provenance.get("fingerprint") if isinstance(provenance, Mapping) else None
