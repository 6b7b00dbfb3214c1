"""The learning-rate schedule of LACUNA's runs for the unlearning trainer (torch-free: the CLI's preflight checks
``trainer.args.min_lr_ratio`` with it before anything heavy is imported)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_min_lr_ratio", "warmup_cosine_factor"]


def warmup_cosine_factor(step: int, *, warmup: int, total: int, floor: float) -> float:
    """The learning-rate multiplier of optimizer step ``step`` (0-based) of ``total``: LACUNA's schedule.

    A linear warmup over ``warmup`` steps that starts above 0 (step k runs at (k + 1) / ``warmup`` of the peak, as
    the testbed's injection does), then a cosine from the peak down to ``floor`` x peak, reached at the last step.
    HF's ``cosine`` starts its warmup at 0 and decays towards 0: with 5 steps and a 10% warmup its first step runs
    at learning rate 0, a fifth of a one-epoch relearning budget spent on nothing."""
    if step < warmup:
        return (step + 1) / warmup
    peak = max(warmup - 1, 0)  # the step that runs at the peak
    progress = min(1.0, (step - peak) / max(1, total - 1 - peak))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def check_min_lr_ratio(value: Any, scheduler: Any) -> float | None:
    """``trainer.args.min_lr_ratio`` checked: None, or a number in [0, 1] with the ``cosine`` scheduler (the only one
    it shapes); ValueError naming the key otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"trainer.args.min_lr_ratio must be a number in [0, 1] or null, got {value!r}")
    name = getattr(scheduler, "value", scheduler)  # TrainingArguments holds a SchedulerType
    if name != "cosine":
        raise ValueError(
            f"trainer.args.min_lr_ratio={value} shapes the cosine schedule only; lr_scheduler_type is {name!r} "
            "(set trainer.args.lr_scheduler_type=cosine or trainer.args.min_lr_ratio=null)"
        )
    return float(value)
