"""Unlearning methods: one small module each, registered by name (OpenUnlearning's registry pattern).

Training-free methods (FRP, AlphaEdit, Selective Pruning) are not losses; ``lacuna_unlearn.train.EDITORS``
dispatches them.

A method turns a ``{"forget": batch, "retain": batch}`` input into a loss, using the shared helpers of
:mod:`lacuna_unlearn.losses`. ``needs_reference`` asks the trainer for a frozen copy of the initial model.
"""

from __future__ import annotations

from typing import Any

from lacuna_unlearn.methods.base import Method
from lacuna_unlearn.methods.finetune import Finetune
from lacuna_unlearn.methods.grad_ascent import GradAscent
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.idk_dpo import IdkDPO
from lacuna_unlearn.methods.jensun import JensUn
from lacuna_unlearn.methods.memflex import MemFlex
from lacuna_unlearn.methods.npo import NPO
from lacuna_unlearn.methods.rlabel import RLabel
from lacuna_unlearn.methods.rmu import RMU
from lacuna_unlearn.methods.simnpo import SimNPO
from lacuna_unlearn.methods.undial import UNDIAL
from lacuna_unlearn.methods.wagle import WAGLE

__all__ = ["METHODS", "Method", "make_method"]

METHODS: dict[str, type[Method]] = {
    "grad_ascent": GradAscent,
    "grad_diff": GradDiff,
    "npo": NPO,
    "simnpo": SimNPO,
    "rmu": RMU,
    "jensun": JensUn,
    "rlabel": RLabel,
    "undial": UNDIAL,
    "idk_dpo": IdkDPO,
    "memflex": MemFlex,  # LoRA parameters located by forget/retain gradients (docs/definitions.md#memflex)
    "wagle": WAGLE,  # weight-attribution mask, then a gradient objective on the located weights
    "finetune": Finetune,  # the relearning attack's objective, not an unlearning method
}


def make_method(name: str, **args: Any) -> Method:
    """Instantiate a registered method with its hyper-parameters; unknown names and arguments are errors."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {sorted(METHODS)}")
    cls = METHODS[name]
    try:
        return cls(**args)
    except TypeError as exc:
        raise ValueError(f"method {name!r}: {exc}") from None
