"""Hatch build hook: editable installs get only the lm-eval autoload hook, not a copy of task_yamls/.

A copy would go stale as the YAMLs are edited; editable installs read ``task_yamls/`` live from the
checkout (see ``lacuna_tasks.harness.register.tasks_dir``).
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class EditableHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if version == "editable":
            build_data["force_include_editable"] = {
                "_lacuna_lmeval_hook.py": "_lacuna_lmeval_hook.py",
                "lacuna_bench_lmeval.pth": "lacuna_bench_lmeval.pth",
            }
