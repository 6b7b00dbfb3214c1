"""``lacuna demo`` is ``lacuna run --preset demo``: an evaluation-only run on the smoke testbed, and its ``-v``/``-q``
(the configuration system itself: tests/unlearn/test_config.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_is_an_evaluation_only_run(smoke_testbed, tmp_path):
    """``lacuna demo`` = ``lacuna run --preset demo``: the before-unlearning evaluation of an existing testbed,
    no method; stage logs go to stderr (silenced by -q), the report to stdout; a rerun is all cache."""
    out = tmp_path / "demo"
    argv = [
        sys.executable,
        "-m",
        "lacuna_unlearn.bench.cli.main",
        "demo",
        "--testbed",
        str(smoke_testbed),
        "--out",
        str(out),
    ]
    argv += ["--field", "phone", "--set", "eval.tasks=[forget_qa]", "--set", "eval.neutral_ppl=false"]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[phone] evaluate before: running" in first.stderr and "before unlearning" in first.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["methods"] == {} and results["field"] == "phone"
    assert results["preset"] == "smoke"  # the given testbed's preset, not the config's default (mini)
    assert (out / "report.md").read_text().startswith("# lacuna run: smoke testbed")
    assert results["manifest"]["config"]["attack"]["enabled"] is False
    assert results["baseline"]["behaviour"]["forget_leak"] is not None
    quiet = subprocess.run([*argv, "-q"], capture_output=True, text=True, timeout=900)
    assert quiet.returncode == 0 and "cached" not in quiet.stderr and "before unlearning" in quiet.stdout
    verbose = subprocess.run([*argv, "-v"], capture_output=True, text=True, timeout=900)
    assert verbose.returncode == 0 and "[phone] evaluate before: cached" in verbose.stderr
