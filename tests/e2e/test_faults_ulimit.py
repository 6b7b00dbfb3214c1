"""File-system faults through real processes (issue 37 item 6): a file size limit (``ulimit -f``: the kernel's EFBIG at
the first write past it, what a full disk's ENOSPC looks like to a writer) and ``lacuna-unlearn``'s bad data and
symlink loops. The in-process cases (a simulated full disk, unreadable and non-UTF-8 data, symlink loops in every
``lacuna`` command) are ``fault/*`` in tests/helpers/bad_input_cases.py. Each command here fails in seconds.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.bad_input_cases import _DATA_ARGS, BIN, Inputs, _left_behind, _rev, _score, build_inputs, symlink_loop

LIMIT = 128  # bytes: the lock files fit, no output does


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    return build_inputs(tmp_path_factory.mktemp("faults"))


def _limited() -> None:
    """In the child: writes past LIMIT fail with EFBIG (SIGXFSZ, which would kill it, ignored)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _script(*argv: str, tmp: Path, limited: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LACUNA_CACHE": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=300, env=env, preexec_fn=_limited if limited else None
    )


def _one_line(result: subprocess.CompletedProcess[str], *named: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    for culprit in named:
        assert culprit in err, (culprit, err)
    return err


@pytest.mark.parametrize(
    ("argv", "written"),
    [
        (lambda i, o: _score(i, o), lambda o: o / "score.md"),
        (lambda i, o: ["data", "generate", *_DATA_ARGS, "--out", str(o)], lambda o: o / "profiles.jsonl"),
        (lambda i, o: [*_rev(i, o), "--out", str(o)], lambda o: o),
    ],
    ids=["score", "data-generate", "reversibility"],
)
def test_a_file_size_limit_is_one_line_naming_the_file(argv, written, inputs, tmp_path):
    out = tmp_path / "out"
    result = _script(str(BIN / "lacuna"), *argv(inputs, out), tmp=tmp_path, limited=True)
    _one_line(result, f"cannot write {written(out)}: file too large")
    assert not _left_behind(out) and not list(tmp_path.glob(".out*")), list(tmp_path.iterdir())


def test_safetensors_past_the_limit_names_the_file_and_leaves_nothing(tmp_path):
    """safetensors reports its I/O errors as text (``... (os error 27)``): save_tensors turns it into the OSError."""
    code = (
        "import torch; from lacuna_metrics import save_tensors\n"
        "try:\n"
        f"    save_tensors({str(tmp_path / 'm.safetensors')!r}, {{'w': torch.zeros(4096)}})\n"
        "except OSError as exc:\n"
        "    print(exc.errno, exc.filename)\n"
    )
    result = _script(str(BIN / "python"), "-c", code, tmp=tmp_path, limited=True)
    assert result.stdout.split() == ["27", str(tmp_path / "m.safetensors")], result.stderr[-2000:]
    assert not list(tmp_path.glob("*m.safetensors*"))


def _unlearn(inputs: Inputs, *overrides: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    base = ["method=grad_diff", f"model={inputs.before}"]
    return _script(str(BIN / "lacuna-unlearn"), *base, *overrides, tmp=tmp)


def test_lacuna_unlearn_output_dir_through_a_symlink_loop(inputs, tmp_path):
    loop = symlink_loop(tmp_path)
    result = _unlearn(inputs, f"data={inputs.data}", f"output_dir={loop / 'out'}", tmp=tmp_path)
    _one_line(result, f"output_dir={loop / 'out'}", f"{loop} is a symlink loop")


def test_lacuna_unlearn_data_through_a_symlink_loop(inputs, tmp_path):
    loop = symlink_loop(tmp_path)
    result = _unlearn(inputs, f"data={loop / 'data'}", f"output_dir={tmp_path / 'out'}", tmp=tmp_path)
    _one_line(result, f"data={loop / 'data'}", "symlink loop")
    assert not _left_behind(tmp_path / "out")


def test_lacuna_unlearn_data_not_utf8(inputs, tmp_path):
    out = tmp_path / "out"
    result = _unlearn(inputs, f"data={inputs.data_not_utf8}", f"output_dir={out}", tmp=tmp_path)
    _one_line(result, f"{inputs.data_not_utf8 / 'forget.jsonl'}:3: not UTF-8", "byte offset")
    assert not _left_behind(out) and not list(tmp_path.glob(".out*"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file; the in-process fault/*-unreadable cases "
                    "simulate the denied read instead")  # fmt: skip
def test_lacuna_unlearn_data_unreadable(inputs, tmp_path):
    out = tmp_path / "out"
    result = _unlearn(inputs, f"data={inputs.data_unreadable}", f"output_dir={out}", tmp=tmp_path)
    _one_line(result, f"{inputs.data_unreadable / 'forget.jsonl'}: cannot read: permission denied")
    assert not _left_behind(out)
