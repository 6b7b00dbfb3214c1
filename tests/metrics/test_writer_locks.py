"""One writer per output: a second ``lacuna score`` / ``build-testbed`` / ``lacuna-unlearn`` / ``attack`` / ``run``
into the same place fails at once naming the holder, instead of publishing a mix of two runs (issue 37 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lacuna_metrics import exclusive_writer


@pytest.fixture()
def holder(tmp_path):
    """Another process holding the lock of ``tmp_path / "out"`` (as a concurrent writer would) until the test ends."""
    out = tmp_path / "out"
    ready = tmp_path / "ready"
    code = (
        "import sys, time, pathlib\n"
        "from lacuna_metrics import exclusive_writer\n"
        f"with exclusive_writer({str(out)!r}, 'lacuna score'):\n"
        f"    pathlib.Path({str(ready)!r}).write_text('x')\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, "the holder did not start"
        time.sleep(0.05)
    yield out, proc.pid
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused_naming_the_holder_and_the_flag(holder):
    out, pid = holder
    with pytest.raises(FileExistsError) as err:
        with exclusive_writer(out, "lacuna score"):
            pass
    message = str(err.value)
    assert str(out) in message and f"pid {pid}" in message and "--out" in message


def test_the_lock_is_free_again_when_the_holder_dies(holder):
    out, pid = holder
    os.kill(pid, 9)
    time.sleep(0.5)
    with exclusive_writer(out, "lacuna score"):
        pass  # an flock dies with its process: no stale lock


def test_score_refuses_before_any_work(holder):
    from lacuna_metrics import score_to_dir

    out, _ = holder
    with pytest.raises(FileExistsError, match="another lacuna score is writing here"):
        score_to_dir(out, after="/nonexistent")  # refused by the lock, not by the missing checkpoint
    assert not out.exists()


def test_build_testbed_refuses_before_any_work(holder):
    from lacuna_unlearn.testbed.build import build_testbed

    out, _ = holder
    with pytest.raises(FileExistsError, match="another lacuna score is writing here"):  # the holder is named
        build_testbed(out, preset="smoke")
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_only_the_main_process_of_a_distributed_launch_takes_the_lock(holder, monkeypatch):
    out, _ = holder
    monkeypatch.setenv("RANK", "1")
    with exclusive_writer(out, "lacuna build-testbed"):
        pass  # rank 1 writes nothing of its own; rank 0 holds the lock for the job
