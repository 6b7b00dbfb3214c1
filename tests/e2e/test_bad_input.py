"""Bad input, every CLI: each case asserts the exit code, no traceback, the culprit named, nothing half-written.

Cases run the real console scripts in a subprocess (what a user sees), on a tiny testbed-shaped directory
where one is needed; every case must fail fast, before any model is loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def _cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=300, cwd=cwd)


def _assert_refused(result: subprocess.CompletedProcess[str], *named: str, code: int = 2) -> None:
    err = result.stderr
    assert result.returncode == code, (result.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    for culprit in named:
        assert culprit in err, (culprit, err[-2000:])


@pytest.fixture(scope="module")
def fake_testbed(tmp_path_factory) -> Path:
    """A directory that passes the 'is a testbed' check (manifest.json) and nothing more: every case below must
    be refused before anything reads the model."""
    root = tmp_path_factory.mktemp("tb")
    (root / "manifest.json").write_text('{"kind": "lacuna-bench-testbed"}')
    (root / "model").mkdir()
    return root


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.args.learning_rate=abc", "trainer.args.learning_rate: expected a number, got 'abc'"),
        ("trainer.args.max_steps=2.5", "trainer.args.max_steps: expected an integer, got 2.5"),
        ("trainer.args.bf16=maybe", "trainer.args.bf16: expected true or false, got 'maybe'"),
        ("trainer.args.learning_rate=nan", "trainer.args.learning_rate: expected a number, got nan"),
        ("method.args.alpha=abc", "method.args.alpha: expected a number, got 'abc'"),
        ("seed=1.5", "seed: expected an integer, got 1.5"),
        ("freeze_embeddings=maybe", "freeze_embeddings: expected true or false, got 'maybe'"),
        ("output_dir=???", "output_dir is required"),
        ("model=/nonexistent/ckpt", "model=/nonexistent/ckpt"),
        ("masks=/nonexistent/masks.safetensors", "masks=/nonexistent/masks.safetensors"),
        ("data=/nonexistent/data", "data=/nonexistent/data"),
        ("+trainer.args.no_such_arg=1", "trainer.args.no_such_arg"),
    ],
)
def test_lacuna_unlearn_refuses_before_loading(fake_testbed, tmp_path, override, named):
    out = tmp_path / "out"
    args = [str(BIN / "lacuna-unlearn"), "method=grad_diff", f"testbed={fake_testbed}", f"output_dir={out}"]
    result = _cli(*args, override)
    _assert_refused(result, named)
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_lacuna_unlearn_refuses_an_existing_output_without_force(fake_testbed, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    result = _cli(str(BIN / "lacuna-unlearn"), "method=grad_diff", f"testbed={fake_testbed}", f"output_dir={out}")
    _assert_refused(result, f"output_dir={out} exists")
    assert (out / "keep.txt").read_text() == "x"


def test_lacuna_unlearn_refuses_a_directory_that_is_not_a_testbed(tmp_path):
    result = _cli(str(BIN / "lacuna-unlearn"), f"testbed={tmp_path}", f"output_dir={tmp_path / 'out'}")
    _assert_refused(result, f"testbed={tmp_path}: not a testbed")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--set", "attack.atempts=5"], "attack.atempts"),
        (["--set", "seeed=1"], "seeed"),
        (["--set", "attack.attempts=abc"], "attack.attempts"),
        (["--set", "eval.batch_size=0"], "eval.batch_size"),
        (["--set", 'fields=["mail"]'], "fields"),
        (["--set", "noequals"], "noequals"),
        (["--preset", "nope"], "nope"),
    ],
)
def test_lacuna_run_refuses_bad_settings_before_any_work(tmp_path, argv, named):
    out = tmp_path / "run"
    result = _cli(str(BIN / "lacuna"), "run", "--out", str(out), *argv)
    _assert_refused(result, named)
    assert not (out / "stages").exists() and not (out / "results.json").exists()


def test_lacuna_run_refuses_a_malformed_config_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("attack: [unclosed\n")
    result = _cli(str(BIN / "lacuna"), "run", "--config", str(config), "--out", str(tmp_path / "run"))
    _assert_refused(result, str(config))
