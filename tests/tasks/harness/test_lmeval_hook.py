"""The lm-eval registration hook's guards (``_lacuna_lmeval_hook``). ``lacuna data generate`` through the console
script: tests/e2e/test_data_generate_cli.py.
"""

from __future__ import annotations

import types

import pytest

import _lacuna_lmeval_hook as hook
from lacuna_tasks import tasks_dir


def _fake_manager(discovered=None):
    module = types.ModuleType("fake_manager")

    class TaskManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
            self.include_path = include_path

    module.TaskManager = TaskManager
    if discovered is not None:
        module.discover_plugin_task_paths = lambda: discovered
    return module


def test_hook_prepends_our_dir_and_keeps_user_paths():
    module = _fake_manager()
    hook._patch(module)
    ours = str(tasks_dir())
    assert module.TaskManager().include_path == [ours]
    assert module.TaskManager(None, "/user/tasks").include_path == [ours, "/user/tasks"]
    assert module.TaskManager(include_path=["/a", "/b"]).include_path == [ours, "/a", "/b"]
    assert module.TaskManager(include_path=[ours]).include_path == [ours]  # no duplicates
    hook._patch(module)  # idempotent
    assert module.TaskManager().include_path == [ours]


@pytest.mark.parametrize(("discovered", "patched"), [([], True), (["/elsewhere"], True), (None, True)])
def test_hook_patches_unless_lm_eval_discovers_our_entry_point(discovered, patched):
    module = _fake_manager(discovered)
    hook._patch(module)
    assert (module.TaskManager().include_path is not None) is patched


def test_hook_is_a_no_op_once_lm_eval_discovers_our_tasks():
    module = _fake_manager([str(tasks_dir())])
    hook._patch(module)
    assert module.TaskManager().include_path is None
