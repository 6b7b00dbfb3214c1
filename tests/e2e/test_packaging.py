"""A plain wheel install registers the tasks with lm-eval (the editable install is what the other tests use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import REPO


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory) -> Path:
    """A fresh venv holding only our wheel; dependencies come from this interpreter's site-packages
    as a plain path entry (so this env's editable-install .pth files are not processed there)."""
    pytest.importorskip("hatchling")
    root = tmp_path_factory.mktemp("wheel_env")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("lacuna_bench-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (purelib / "zz_lacuna_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    return python


def _run(python: Path, code: str, cwd: Path) -> str:
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_wheel_ships_yamls_and_hook(wheel_env, tmp_path):
    out = _run(
        wheel_env,
        "import lacuna_tasks, _lacuna_lmeval_hook as h; print(lacuna_tasks.tasks_dir()); print(h.lacuna_task_dir())",
        tmp_path,
    )
    tasks_dir, hook_dir = out.split()
    assert "site-packages" in tasks_dir and tasks_dir.endswith("lacuna_tasks/task_yamls")
    assert Path(hook_dir) == Path(tasks_dir)
    assert str(REPO) not in tasks_dir


def test_wheel_registers_tasks_with_task_manager(wheel_env, tmp_path):
    code = (
        "from lm_eval.tasks import TaskManager\n"
        "tm = TaskManager(include_defaults=False)\n"
        "names = set(tm.all_tasks)\n"
        "print(sorted(n for n in names if n.startswith('lacuna'))[:3], len(names))\n"
        "assert {'lacuna', 'lacuna_email', 'lacuna_email_forget_qa', 'lacuna_forget'} <= names\n"
    )
    _run(wheel_env, code, tmp_path)


def test_hook_can_be_disabled(wheel_env, tmp_path):
    code = (
        "import os; os.environ['LACUNA_LMEVAL_HOOK'] = '0'\n"
        "from lm_eval.tasks import TaskManager\n"
        "assert 'lacuna_email' not in TaskManager(include_defaults=False).all_tasks\n"
    )
    proc = subprocess.run(
        [str(wheel_env), "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, LACUNA_LMEVAL_HOOK="0"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_wheel_bare_lm_eval_cli(wheel_env, tiny_lacuna, tmp_path):
    """`lm_eval --tasks lacuna_email_forget_qa` with no --include_path, from a wheel install."""
    cmd = [
        str(wheel_env), "-m", "lm_eval",
        "--model", "hf",
        "--model_args", f"pretrained={tiny_lacuna.model_dir},dtype=float32",
        "--tasks", "lacuna_email_forget_qa",
        "--metadata", json.dumps({"lacuna_data": str(tiny_lacuna.data_dir)}),
        "--limit", "2",
        "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lacuna_email_forget_qa" in proc.stdout and "leak_rate" in proc.stdout
