"""Progress when stderr is no terminal (CI, nohup, a log file): one plain line per interval with the stage's name,
the count, an estimate of what remains and the thread count, and nothing for short work (issue 37 item 8)."""

from __future__ import annotations

import io
import re
import time

import pytest

from lacuna_tasks import logs
from lacuna_tasks.logs import LineProgress, progress


@pytest.fixture(autouse=True)
def _not_quiet(monkeypatch):
    """No earlier test's ``--quiet`` (a process-wide setting) leaks into these."""
    monkeypatch.setattr(logs, "_bars_enabled", None)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_stage_reports_lines_with_name_count_estimate_and_end(monkeypatch, capsys):
    monkeypatch.setenv("LACUNA_PROGRESS_SECONDS", "0.05")
    with progress(total=8, desc="injection", unit="step") as bar:
        assert isinstance(bar, LineProgress)
        for _ in range(8):
            time.sleep(0.03)
            bar.update(1)
            bar.set_postfix(loss="0.5", refresh=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) >= 3, lines
    assert re.fullmatch(
        r"injection: \d/8 step \(\d+%\), \d+s elapsed( on \d+ threads?)?, ~\d+s left, loss=0.5", lines[0]
    )
    assert re.fullmatch(r"injection: 8/8 step \(100%\), \d+s elapsed, done, loss=0.5", lines[-1]), lines[-1]


def test_short_work_prints_nothing_and_quiet_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("LACUNA_PROGRESS_SECONDS", "60")
    assert list(progress(range(5), desc="quick")) == [0, 1, 2, 3, 4]
    monkeypatch.setenv("LACUNA_PROGRESS_SECONDS", "0")
    monkeypatch.setattr(logs, "_bars_enabled", False)  # what --quiet sets
    assert list(progress(range(5), desc="quiet")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""


def test_a_terminal_gets_the_tqdm_bar(monkeypatch):
    from tqdm.auto import tqdm

    monkeypatch.setattr("sys.stderr", _Terminal())
    bar = progress(total=3, desc="scoring")
    assert isinstance(bar, tqdm)
    bar.close()


@pytest.mark.parametrize(("value", "shown"), [(999, "999"), (1234, "1.23k"), (7_000_000_000, "7G")])
def test_scaled_counts(value, shown, monkeypatch, capsys):
    monkeypatch.setenv("LACUNA_PROGRESS_SECONDS", "0")
    bar = progress(total=value, desc="scoring", unit="param", unit_scale=True)
    bar.update(value)
    bar.close()
    assert f"scoring: {shown}/{shown} param (100%)" in capsys.readouterr().err
