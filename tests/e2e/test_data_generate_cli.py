"""``lacuna data generate`` through the console script: the data it writes and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

from lacuna_tasks.loader import load_data


def _lacuna(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lacuna_unlearn.bench.cli.main", *args], capture_output=True, text=True
    )


def test_data_generate_command(tmp_path):
    out = tmp_path / "gen"
    proc = _lacuna("data", "generate", "--profiles", "60", "--seed", "3", "--people-per-field", "4",
                   "--validation-people", "2", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = load_data(out)
    assert len(data.rows("forget", "email")) == 4 and len(data.rows("retain", "email")) == 4
    assert data.profiles is not None and len(data.profiles) == 60


def test_data_generate_bad_input_is_a_clear_error(tmp_path):
    proc = _lacuna("data", "generate", "--profiles", "5", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert "n >= 12" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()  # nothing half-written
