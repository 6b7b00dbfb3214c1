"""A corrupted LACUNA data directory through the real ``lm_eval`` CLI: one clear error naming the problem (the
validation itself: tests/tasks/test_data_validation.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lacuna_tasks.loader import BUNDLED_DIR


@pytest.fixture
def data_dir(tmp_path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(BUNDLED_DIR, dst)
    return dst


def read(d: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (d / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def write(d: Path, name: str, rows: list[dict]) -> None:
    (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["lacuna_email_forget_qa", "lacuna_email_crossfield_qa"])
def test_lm_eval_cli_reports_the_data_error(data_dir, tmp_path, task):
    """Through the real ``lm_eval`` CLI (dummy model: no weights): exit 2, our one-line message, no traceback;
    for the utility tasks (``lacuna_tasks/harness/utility.py``) as for the others."""
    rows = read(data_dir, "forget")
    rows[1]["ID"] = rows[0]["ID"]
    write(data_dir, "forget", rows)
    cmd = [
        str(Path(sys.executable).with_name("lm_eval")), "--model", "dummy",
        "--tasks", task,
        "--metadata", json.dumps({"lacuna_data": str(data_dir)}),
        "--output_path", str(tmp_path / "out"),
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    expected = (
        f"lm_eval: error: {data_dir.resolve() / 'forget.jsonl'}: split 'forget' row 1: duplicate ID '{rows[0]['ID']}'"
    )
    assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "out").rglob("results_*.json"))
