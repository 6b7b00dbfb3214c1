"""Which evaluated training step to keep, from a curve of ``{"step": N, <metric>: value}`` points (torch-free: the
CLI's preflight checks ``trainer.args.best_by`` with it before anything heavy is imported).

Two rules over the same curves: :func:`choose_step`, the stopping point of ``lacuna run`` (the first step whose leak is
at most a threshold, lacuna_unlearn/bench/stopping.py), and :func:`best_step`, the checkpoint ``lacuna-unlearn`` keeps
when it evaluates during training (``trainer.args.eval_every`` / ``trainer.args.best_by``, docs/unlearning.md).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["BEST_BY", "best_step", "check_best_by", "check_evaluation", "choose_step", "validation_rows"]

#: ``trainer.args.best_by`` criteria, each measured on the run's field's validation people; lower is better for both.
BEST_BY: dict[str, str] = {
    "validation_leak": "share of validation people whose answer greedy decoding produces (the forget_qa probe)",
    "eval_loss": "mean answer-token NLL of the validation people's QA (the unlearning labels)",
}


def check_best_by(value: Any) -> str:
    """``trainer.args.best_by`` checked: one of :data:`BEST_BY`; ValueError naming the key otherwise."""
    if not isinstance(value, str) or value not in BEST_BY:
        raise ValueError(f"trainer.args.best_by must be one of {sorted(BEST_BY)}, got {value!r}")
    return value


def check_evaluation(every: Any, best_by: Any) -> int:
    """``trainer.args.eval_every`` (optimizer steps, 0: off) and ``trainer.args.best_by`` checked; returns
    ``eval_every``. ValueError naming the key otherwise."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"trainer.args.eval_every must be an optimizer step count >= 0, got {every!r}")
    check_best_by(best_by)
    return every


def validation_rows(data: Any, field: str, best_by: str) -> list[dict[str, Any]]:
    """The validation people's QA rows of ``field`` (``all``: every field) in a loaded ``LacunaData``: what
    ``trainer.args.best_by`` is computed on. ValueError naming the key when the data has none (LACUNA gives
    validation people to two fields only)."""
    from lacuna_unlearn.qa.unlearn_data import split_rows

    if not data.has_split("validation"):
        raise ValueError(
            f"trainer.args.best_by={best_by} needs validation people, and {data.source} has no validation split "
            "(set trainer.args.eval_every=0)"
        )
    try:
        return split_rows(data, "validation", field)
    except ValueError:
        raise ValueError(
            f"trainer.args.best_by={best_by} needs validation people of field={field}, and the validation split of "
            f"{data.source} has none (set trainer.args.eval_every=0)"
        ) from None


def choose_step(curve: list[dict[str, Any]], metric: str, threshold: float) -> dict[str, Any]:
    """The first evaluated step whose ``metric`` is at most ``threshold`` (``reached``), and the evaluated step just
    before it (``previous``, 0: the start); without one, the last step (``reached`` false)."""
    points = sorted((p for p in curve if p.get(metric) is not None), key=lambda p: p["step"])
    if not points:
        raise ValueError(f"stopping: no snapshot has a {metric!r} value")
    previous = 0
    for point in points:
        if point[metric] <= threshold:
            return {"step": point["step"], "previous": previous, "reached": True}
        previous = point["step"]
    return {"step": points[-1]["step"], "previous": points[-1]["step"], "reached": False}


def best_step(curve: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The evaluated step with the lowest ``metric`` (``step``, ``value``), the earliest of equal ones: a later step
    must do strictly better to be kept. A NaN (a diverged loss) ranks below every number."""
    points = sorted((p for p in curve if p.get(metric) is not None), key=lambda p: p["step"])
    if not points:
        raise ValueError(f"trainer.args.best_by={metric}: no evaluated step has a value")
    best = points[0]
    for point in points[1:]:
        if _rank(point[metric]) < _rank(best[metric]):
            best = point
    return {"step": best["step"], "value": best[metric]}


def _rank(value: float) -> float:
    """``value`` for comparison, NaN as +inf (never better than a number)."""
    return math.inf if math.isnan(value) else value
