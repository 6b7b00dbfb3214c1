"""Deprecated alias of :mod:`lacuna_tasks.harness.hooks`, kept for one release: lm-eval results files written before
the move record ``!function lacuna_tasks.lm_eval_hooks.<name>`` in their task configs, which lm-eval resolves with
``getattr`` on this module."""

from typing import Any

from lacuna_tasks.harness import hooks as _hooks


def __getattr__(name: str) -> Any:
    return getattr(_hooks, name)
