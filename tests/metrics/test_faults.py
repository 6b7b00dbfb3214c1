"""lacuna_metrics.faults: the one line a command prints for a file-system fault, and the writers naming their file.
Every command's faults: ``fault/*`` in tests/helpers/bad_input_cases.py; real ``ulimit -f``: tests/e2e/test_faults_ulimit.py."""

from __future__ import annotations

import errno

import pytest

from lacuna_metrics import error_line, naming_outputs, publish_together, symlink_loop, write_text, writing


def test_error_line_names_the_file_and_the_cause(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", "/o/score.json")
    assert error_line(full) == "cannot write /o/score.json: no space left on device"
    assert (
        error_line(PermissionError(errno.EACCES, "Permission denied", "/d/f.jsonl")) == "/d/f.jsonl: permission denied"
    )
    assert error_line(OSError(errno.ELOOP, "Too many levels of symbolic links", "/a")).startswith("/a: symlink loop")
    assert error_line(FileNotFoundError("--out x: no such file")) == "--out x: no such file"  # our own messages
    assert error_line(ValueError("bad")) == "bad"
    native = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert error_line(native).startswith("no space left on device: Error while serializing")
    assert error_line(RuntimeError("a bug")) is None  # not ours to hide: its traceback shows


def test_writing_names_the_output_and_naming_outputs_moves_it_out_of_staging(tmp_path):
    with pytest.raises(OSError) as caught, writing(tmp_path / "m.safetensors"):
        raise RuntimeError("Error while serializing: I/O error: File too large (os error 27)")
    assert (caught.value.errno, caught.value.filename) == (errno.EFBIG, str(tmp_path / "m.safetensors"))
    with pytest.raises(KeyError), writing(tmp_path / "x"):  # not a fault: unchanged
        raise KeyError("x")
    staging, out = tmp_path / "out.partial", tmp_path / "out"
    with pytest.raises(OSError) as caught, naming_outputs(staging, out):
        raise OSError(errno.ENOSPC, "No space left on device", str(staging / "model" / "config.json"))
    assert caught.value.filename == str(out / "model" / "config.json")


def test_a_failed_publish_leaves_no_output_directory(tmp_path, monkeypatch):
    import os

    out = tmp_path / "new"

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"), publish_together(out) as staging:
        monkeypatch.setattr(os, "replace", full)  # the disk fills while the outputs are written
        write_text(staging / "a.json", "{}")
    assert not out.exists()  # created by the publish, removed with it


def test_symlink_loop_finds_the_looping_ancestor(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert symlink_loop(tmp_path / "a" / "x" / "y") == tmp_path / "a"
    assert symlink_loop(tmp_path / "missing" / "x") is None and symlink_loop(tmp_path) is None


def test_torch_save_over_a_file_size_limit_is_a_fault_naming_the_output(tmp_path):
    """The HF Trainer writes checkpoints with torch.save, whose zip writer reports a failed write without an errno
    ("unexpected pos …"): under a real ``ulimit -f`` it becomes one line naming the output, not a traceback."""
    import resource
    import signal
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from lacuna_metrics import error_line, writing\n"
        "try:\n"
        f"    with writing({str(tmp_path / 'out')!r}):\n"
        f"        torch.save({{'a': torch.zeros(100_000)}}, {str(tmp_path / 'big.pt')!r})\n"
        "except Exception as exc:\n"
        "    print(error_line(exc))\n"
    )

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"{tmp_path / 'out'}: input/output error", proc.stdout
