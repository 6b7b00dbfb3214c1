"""Uncertainty over persons: per-person values from lm-eval's logged samples and exact intervals of rates over them.

Every behaviour metric of a run is a mean over persons (a leak rate, an accuracy, the share of persons leaking
under any probe), so its uncertainty comes from which persons happen to be in the split, and the unit is the
person, never the document: the 16 paraphrases of one person are not 16 independent draws. A cell rests on 1 to 20
persons and is mostly 0/n or n/n, where a percentile bootstrap collapses to [0, 0] and covers the true rate far
less often than it claims; the intervals here are exact (Clopper-Pearson), so they keep their coverage at any n
(docs/report.md, "Intervals").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_LEVEL", "clopper_pearson", "mean_sd", "per_person_values", "rate_interval"]

#: Confidence level of every interval lacuna-bench reports.
DEFAULT_LEVEL = 0.95

#: How far a per-person value may stray outside [0, 1] by float rounding before it is refused.
_SLACK = 1e-9


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


def clopper_pearson(k: float, n: int, *, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval ``(low, high)`` of a proportion after ``k`` successes in ``n`` trials.

    Exact because the cells it serves rest on a handful of persons: its coverage is at least ``level`` for every
    true rate and every ``n`` (0 of 5 gives [0, 0.52] at 95%), where normal and bootstrap intervals collapse to a
    point. ``k`` may be fractional, the sum of ``n`` per-person values in [0, 1]: the Beta quantiles below take real
    shapes, and the interval then stays at or above ``level`` by simulation (see :func:`rate_interval`).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"clopper_pearson needs n >= 1 trials, got {n!r}")
    if not math.isfinite(k) or not 0.0 <= k <= n:
        raise ValueError(f"clopper_pearson needs 0 <= k <= n = {n}, got k = {k!r}")
    from scipy import stats  # lazy: importing lacuna_metrics stays light

    alpha = 1.0 - level
    low = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha / 2, k + 1, n - k))
    return low, high


def rate_interval(
    values: Sequence[float] | Mapping[str, float], *, metric: str, level: float = DEFAULT_LEVEL
) -> dict[str, Any] | None:
    """The interval of a rate over persons, as results.json records it: ``{"low", "high", "k", "n", "level",
    "method"}``; None when no person observed the metric (n = 0).

    ``values`` holds one value in [0, 1] per person. All 0 or 1 (a person leaked or not, was answered or not):
    ``method`` "clopper_pearson", the exact binomial interval of ``k`` of ``n`` persons. Otherwise (a person's share
    of several questions, as in cross-field retention, or a continuous score such as ES or Prob): ``method``
    "clopper_pearson_fractional", the same Beta quantiles with ``k`` the sum of the values. A value in [0, 1] of
    mean p is less spread than a 0/1 outcome of mean p, so the sum is less spread than the binomial the interval
    is built for and the interval errs wide. That argues coverage rather than proving it, so it is checked:
    simulated >= 95% for shares of several questions and for continuous scores, and exactly for values of 0.01
    or 0.99 (tests/metrics/behaviour/test_intervals.py, benchmarks/bench_interval_coverage.py). A t-interval, the usual choice for means, covers 18% of the time at
    n = 2 and p = 0.05 there (it collapses to a point whenever every person has the same value), so it is not used.
    Raises ValueError naming ``metric`` (and the person) for a NaN, infinite or out-of-range value.
    """
    items = list(values.items()) if isinstance(values, Mapping) else list(enumerate(values))
    if not items:
        return None
    clean: list[float] = []
    for person, value in items:
        who = f"person {person!r}" if isinstance(values, Mapping) else f"value #{person}"
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{metric}: {who} has non-numeric value {value!r}") from None
        if not math.isfinite(v):
            raise ValueError(f"{metric}: {who} has value {v}; an interval over persons needs finite values")
        if not -_SLACK <= v <= 1.0 + _SLACK:
            raise ValueError(f"{metric}: {who} has value {v}, outside [0, 1]; only rates get a binomial interval")
        clean.append(min(max(v, 0.0), 1.0))
    n = len(clean)
    binary = all(v in (0.0, 1.0) for v in clean)
    total = math.fsum(clean)
    low, high = clopper_pearson(total, n, level=level)
    return {
        "low": low,
        "high": high,
        "k": int(total) if binary else round(total, 6),
        "n": n,
        "level": level,
        "method": "clopper_pearson" if binary else "clopper_pearson_fractional",
    }


def mean_sd(values: Sequence[float]) -> dict[str, float | int | None]:
    """``{"mean", "sd", "n"}`` of repeated runs (sample sd, ddof 1; None for a single run)."""
    import numpy as np

    data = np.asarray(list(values), dtype=np.float64)
    if data.size == 0:
        raise ValueError("mean_sd: no values")
    sd = float(data.std(ddof=1)) if data.size > 1 else None
    return {"mean": float(data.mean()), "sd": sd, "n": int(data.size)}
