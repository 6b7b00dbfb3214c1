"""Make ``lm_eval --tasks lacuna_*`` work with no ``--include_path`` (lm-eval 0.4.x).

lm-eval 0.4.13 finds tasks only under ``lm_eval/tasks`` and ``--include_path``; it has no plugin
mechanism yet (see ``docs/definitions.md#lm-eval-task-discovery``). ``lacuna_bench_lmeval.pth`` imports this
module at interpreter start. It installs a meta-path finder that reacts only to the import of
``lm_eval.tasks.manager`` and then wraps ``TaskManager.__init__`` so our task directory is the
first include path (a user's ``--include_path`` still overrides our tasks).

It does nothing when lm-eval already discovers our ``lm_eval.tasks`` entry point itself
(``discover_plugin_task_paths``, lm-eval PR #4015), or when ``LACUNA_LMEVAL_HOOK=0``.
Kept dependency-free and cheap: this runs in every interpreter of the environment.
"""

from __future__ import annotations

import os
import sys

_TARGET = "lm_eval.tasks.manager"


def lacuna_task_dir() -> str | None:
    """Our task YAML directory (None if lacuna_tasks is not importable or has no YAMLs).

    ``lacuna_tasks.harness.register.tasks_dir`` is the one lookup for both install kinds. It is imported here, not at
    interpreter start: this runs only once lm-eval imports its task manager, and ``lacuna_tasks.harness.register`` needs
    nothing but the standard library.
    """
    try:
        from lacuna_tasks import tasks_dir

        return str(tasks_dir())
    except (ImportError, FileNotFoundError):
        return None


def _already_discovered(module, ours: str) -> bool:
    discover = getattr(module, "discover_plugin_task_paths", None)
    if discover is None:
        return False
    try:
        found = {os.path.realpath(str(p)) for p in discover()}
    except Exception:  # a broken plugin elsewhere must not disable our tasks
        return False
    return os.path.realpath(ours) in found


def _patch(module) -> None:
    manager = getattr(module, "TaskManager", None)
    if manager is None or getattr(manager, "_lacuna_patched", False):
        return
    ours = lacuna_task_dir()
    if ours is None or _already_discovered(module, ours):
        return
    import functools
    import inspect

    original = manager.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind_partial(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)
        user = bound.arguments.get("include_path")
        paths = [] if user is None else ([user] if isinstance(user, (str, os.PathLike)) else list(user))
        if os.path.realpath(ours) not in {os.path.realpath(str(p)) for p in paths}:
            bound.arguments["include_path"] = [ours, *paths]
        return original(*bound.args, **bound.kwargs)

    manager.__init__ = __init__
    manager._lacuna_patched = True


class _ManagerFinder:
    """Duck-typed meta-path finder (no importlib.abc import: keeps interpreter start cheap)."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_original = spec.loader.exec_module

        def exec_module(module):
            exec_original(module)
            try:
                _patch(module)
            except Exception as exc:  # never break lm-eval because of our hook
                import logging

                logging.getLogger("lacuna_tasks.harness.register").warning(
                    "lacuna-bench: could not register tasks with lm-eval (%s)", exc
                )

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if os.environ.get("LACUNA_LMEVAL_HOOK", "1") == "0":
        return
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
        return
    if not any(isinstance(f, _ManagerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ManagerFinder())


install()
