"""SIGTERM cleans up like Ctrl-C: a real ``build-testbed`` process killed mid-build leaves nothing behind (the other
run-safety checks: tests/unlearn/bench/test_run_safety.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigterm_removes_partial_outputs(tmp_path):
    out = tmp_path / "tb"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lacuna_unlearn.bench.cli.main",
            "build-testbed",
            "--preset",
            "smoke",
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    partial = Path(str(out) + ".partial")
    deadline = time.time() + 120
    while not partial.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert partial.exists(), "the build never started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in err
    assert not partial.exists() and not out.exists()
