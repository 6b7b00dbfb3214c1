"""Run LACUNA tasks through lm-eval's Python API (``simple_evaluate``) on a local HF checkpoint.

For tools that compose evaluations (``lacuna attack``, ``lacuna run``): one call returns the aggregated
metrics and, per task, the per-person leak map recomputed from the logged samples, so callers can form
sets (forgotten, resurfaced) without re-parsing lm-eval's output files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lacuna_tasks.harness.results import task_metrics

__all__ = ["evaluate", "leaked_people"]


def evaluate(
    model_dir: str | os.PathLike[str],
    tasks: Sequence[str],
    *,
    data: str | os.PathLike[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    batch_size: int = 32,
    limit: int | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """``{"results": {task: {metric: value}}, "samples": {task: [sample, ...]}, "config": ...}`` of one model.

    Metric names are bare (``leak_rate``): the filter suffix is dropped by
    :func:`lacuna_tasks.harness.results.task_metrics`, the rule every lm-eval results reader here follows.

    ``data`` is the LACUNA data source (``--metadata lacuna_data``); ``metadata`` adds task options such as
    ``extraction_attempts``. The model is loaded from disk only (no hub), ``trust_remote_code`` off.
    """
    import lm_eval
    import torch

    from lacuna_tasks.harness.register import task_manager

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not an HF checkpoint directory (no config.json)")
    meta = {"pretrained": str(path), **(metadata or {})}  # the memorization tasks tokenize with the model's tokenizer
    if data is not None:
        meta["lacuna_data"] = str(data)
    with _quiet_lm_eval():
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(path), "dtype": dtype, "trust_remote_code": False},
            tasks=list(tasks),
            batch_size=batch_size,
            device="cuda" if torch.cuda.is_available() else "cpu",
            limit=limit,
            log_samples=True,
            task_manager=task_manager(meta),
            metadata=meta,
        )
    # metric keys without their filter, by the one rule of lacuna_tasks.harness.results (docs/ci.md)
    results = {task: task_metrics(metrics) for task, metrics in out["results"].items()}
    return {"results": results, "samples": out.get("samples", {}), "config": out.get("config", {})}


@contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """lm-eval's warnings that say nothing to our callers (a "Custom kwargs can be passed to --metadata" notice
    per task, since every LACUNA task has a custom loader) are dropped during our own calls; errors still show."""
    loggers = [logging.getLogger(name) for name in ("lm_eval", "lm-eval")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def leaked_people(samples: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    """Per person: did any logged generation leak (``leak_rate`` = 1)? The basis of Success@N."""
    leaked: dict[str, bool] = {}
    for sample in samples:
        person = str(sample["doc"]["person"])
        leaked[person] = leaked.get(person, False) or float(sample["leak_rate"]) == 1.0
    return leaked
