"""Unlearning methods: one small module each, registered by name in :mod:`lacuna_unlearn.methods.registry`
(OpenUnlearning's registry pattern).

A trained method turns a ``{"forget": batch, "retain": batch}`` input into a loss, using the shared helpers of
:mod:`lacuna_unlearn.methods.losses`; ``needs_reference`` asks the trainer for a frozen copy of the initial model.
Training-free methods (FRP, AlphaEdit, Selective Pruning) are not losses: the registry's ``editor`` entries,
dispatched by :func:`lacuna_unlearn.trainer.app.run`.

Importing this package is cheap (no torch): the method modules load when a method is looked up, and
:class:`Method` when it is first named.
"""

from __future__ import annotations

from typing import Any

from lacuna_unlearn.methods.registry import EDITORS, METHODS, make_method

__all__ = ["EDITORS", "METHODS", "Method", "make_method"]


def __getattr__(name: str) -> Any:
    if name == "Method":  # lazily: base imports torch
        from lacuna_unlearn.methods.base import Method

        return Method
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
