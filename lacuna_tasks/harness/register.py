"""Where our task YAMLs live, and a ready lm-eval ``TaskManager`` for the Python API.

The bare ``lm_eval --tasks lacuna_email`` CLI finds the tasks through the ``.pth`` hook
(``_lacuna_lmeval_hook.py``), which asks :func:`tasks_dir` too: it is the one lookup for both install kinds, so this
module imports nothing outside the standard library at module level (the hook imports it inside lm-eval's task
manager import). These helpers serve ``--include_path`` users and Python callers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def tasks_dir() -> Path:
    """The directory holding ``lacuna.yaml`` and the leaf task YAMLs.

    Source checkouts (and editable installs) keep ``task_yamls/`` at the repository root, read live; wheels ship a
    copy inside the package (pyproject's ``force-include``).
    """
    package = Path(__file__).resolve().parent.parent  # lacuna_tasks/
    for candidate in (package.parent / "task_yamls", package / "task_yamls"):
        if (candidate / "lacuna.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"lacuna task YAMLs not found next to {package}; reinstall lacuna-bench")


def task_manager(
    metadata: Mapping[str, Any] | None = None,
    *,
    include_defaults: bool = False,
    include_path: str | Path | Sequence[str | Path] | None = None,
):
    """A ``lm_eval.tasks.TaskManager`` that knows the LACUNA tasks.

    ``include_defaults=False`` skips indexing lm-eval's ~15k built-in tasks (~16 s per process).
    Pass run options such as ``{"lacuna_data": "runs/mini/data", "pretrained": PATH}`` as
    ``metadata``: with a custom TaskManager, ``simple_evaluate(metadata=...)`` is ignored.
    """
    from lm_eval.tasks import TaskManager

    extra = (
        []
        if include_path is None
        else ([include_path] if isinstance(include_path, (str, Path)) else list(include_path))
    )
    # The .pth hook (if active) adds tasks_dir() itself; passing it again is de-duplicated there.
    return TaskManager(
        include_path=[str(tasks_dir()), *map(str, extra)],
        include_defaults=include_defaults,
        metadata=dict(metadata) if metadata else None,
    )
