"""Uncertainty over persons: per-person values from lm-eval's logged samples and percentile bootstrap intervals.

Every behaviour metric of a run is a mean over persons (a leak rate, an accuracy, the share of persons leaking
under any probe), so its uncertainty comes from which persons happen to be in the split. The interval resamples
persons with replacement, never documents: the 16 paraphrases of one person are not 16 independent draws
(docs/report.md, "Intervals").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_RESAMPLES", "bootstrap_interval", "mean_sd", "per_person_values"]

#: Bootstrap resamples per interval: the 2.5% / 97.5% percentiles move by < 0.01 between seeds at n >= 6 persons.
DEFAULT_RESAMPLES = 2000


def per_person_values(samples: Iterable[Mapping[str, Any]], metric: str) -> dict[str, float]:
    """Person -> the person's value of ``metric`` from lm-eval's logged samples of one task.

    A per-document value that is a ``(person, hit)`` pair (the worst-case metrics ``j_w``, ``j_p``, ``j_icr``)
    counts as the person leaking if any of their observed probes leaked (``hit`` None = probe not part of the
    metric); a plain number (``leak_rate``, ``accuracy``, ``j_avg``, ``em`` ...) is averaged over the person's
    documents. A person none of whose documents observes the metric is left out. The mean of the returned values is
    the task's aggregate whenever every person has the same number of documents, as in LACUNA's tasks.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    union: dict[str, bool] = {}
    for sample in samples:
        if metric not in sample:
            continue
        value = sample[metric]
        if isinstance(value, (list, tuple)):
            person, hit = str(value[0]), value[1]
            if hit is not None:
                union[person] = union.get(person, False) or bool(hit)
            continue
        if value is None:
            continue
        person = str(sample["doc"]["person"])
        sums[person] = sums.get(person, 0.0) + float(value)
        counts[person] = counts.get(person, 0) + 1
    if union and sums:
        raise ValueError(f"metric {metric!r} mixes (person, hit) pairs and plain numbers across documents")
    if union:
        return {p: float(v) for p, v in sorted(union.items())}
    return {p: sums[p] / counts[p] for p in sorted(sums)}


def bootstrap_interval(
    values: Sequence[float] | Mapping[str, float],
    *,
    level: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[float] | None:
    """Percentile bootstrap interval ``[low, high]`` of the mean of ``values`` (one value per person).

    None for no values; ``[v, v]`` for one person or identical values (the data show no spread, which is not the
    same as certainty: report ``n`` beside it). Deterministic for a given ``seed`` (numpy PCG64).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    data = np.asarray(list(values.values()) if isinstance(values, Mapping) else list(values), dtype=np.float64)
    if data.size == 0:
        return None
    if not np.all(np.isfinite(data)):
        raise ValueError("bootstrap_interval: values contain NaN or inf")
    if np.all(data == data[0]):
        return [float(data[0]), float(data[0])]
    rng = np.random.Generator(np.random.PCG64(seed))
    idx = rng.integers(0, data.size, size=(resamples, data.size))
    means = data[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return [float(low), float(high)]


def mean_sd(values: Sequence[float]) -> dict[str, float | int | None]:
    """``{"mean", "sd", "n"}`` of repeated runs (sample sd, ddof 1; None for a single run)."""
    data = np.asarray(list(values), dtype=np.float64)
    if data.size == 0:
        raise ValueError("mean_sd: no values")
    sd = float(data.std(ddof=1)) if data.size > 1 else None
    return {"mean": float(data.mean()), "sd": sd, "n": int(data.size)}
