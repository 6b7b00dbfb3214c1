"""LACUNA data, prompts and lm-evaluation-harness tasks (``lm_eval --tasks lacuna_email``)."""

from lacuna_tasks.harness.register import task_manager, tasks_dir

__version__ = "0.1.0"
__all__ = ["task_manager", "tasks_dir", "__version__"]
