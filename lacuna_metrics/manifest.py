"""What every artifact records about how it was made: versions, hardware, atomic JSON/text/PNG writes, and the lock
that keeps a second writer off an output.

Lives in ``lacuna_metrics`` so both the scorer and the trainers (``lacuna_unlearn``) use one copy.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from lacuna_metrics.faults import naming_outputs, writing

__all__ = [
    "PACKAGES",
    "build_manifest",
    "exclusive_writer",
    "hardware",
    "package_versions",
    "publish_together",
    "save_figure",
    "save_tensors",
    "write_json",
    "write_text",
]

#: The one package list every manifest records (testbed, score, unlearning, attack, run, diagnose, demo).
PACKAGES = (
    "lacuna-bench",
    "torch",
    "transformers",
    "safetensors",
    "numpy",
    "scikit-learn",
    "lm_eval",
    "peft",
    "accelerate",
    "hydra-core",
    "tokenizers",  # a testbed's tokenizer
    "faker",  # a testbed's synthetic people
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` for manifests ("not installed" when absent)."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def hardware() -> dict[str, Any]:
    """Platform, Python, CPU count and torch threads/CUDA, so a timing can be read in context."""
    import torch

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def build_manifest(**fields: Any) -> dict[str, Any]:
    """A manifest: the writer's own ``fields`` plus what every manifest records the same way (``versions`` of
    :data:`PACKAGES`, ``hardware``). Every artifact writer builds its manifest here, so all carry the same
    provenance fields."""
    return {**fields, "versions": package_versions(), "hardware": hardware()}


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) atomically: a temp file in the same directory, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with writing(path), os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_tensors(path: str | os.PathLike[str], tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    """Write a safetensors file atomically (temp file in the same directory + ``os.replace``), mode 0644."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with writing(path):  # safetensors reports a full disk as text
            save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str | os.PathLike[str], content: dict[str, Any]) -> Path:
    """Write ``content`` as indented JSON atomically (NaN is refused: it is not JSON)."""
    return write_text(path, json.dumps(content, indent=2, default=str, allow_nan=False) + "\n")


@contextmanager
def publish_together(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a staging directory inside ``out``; when the block succeeds, move every file written there into
    ``out`` (same relative paths, one ``os.replace`` each, the top-level ``*.json`` last), so readers see a
    command's outputs together: after a failure ``out`` holds nothing new, and never a report beside an older
    JSON. Unlike replacing the whole directory, files of ``out`` that the command does not write are kept. An error
    names the file at its place in ``out``; an ``out`` this call created is removed again when nothing reached it."""
    import shutil

    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        with naming_outputs(staging, out):
            yield staging
            files = sorted(p for p in staging.rglob("*") if p.is_file())
            files.sort(key=lambda p: (p.parent == staging and p.suffix == ".json", str(p)))
            for file in files:
                target = out / file.relative_to(staging)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(file, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            with suppress(OSError):
                out.rmdir()  # only when empty: a file already moved in stays
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Save a matplotlib figure atomically (unique temp file in the same directory + ``os.replace``), close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        with writing(path):
            fig.savefig(tmp, dpi=dpi)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
    return path


@contextmanager
def exclusive_writer(
    out: str | os.PathLike[str], command: str, *, flag: str = "--out", lock: str | os.PathLike[str] | None = None
) -> Iterator[None]:
    """Hold the lock of ``out``'s one writer while the block runs: a second ``command`` writing ``out`` fails at once
    (FileExistsError naming ``out``, the holder's pid and ``flag``) instead of racing the first one's files.

    The lock file is ``lock``, by default ``.NAME.lock`` beside ``out``, so that ``out`` itself may be replaced by
    a rename. In a distributed launch only the main process (``RANK`` unset or 0) takes it. An flock: released by
    the kernel when the holder dies, so a killed writer never leaves a stale lock; a finished one removes its lock
    file (a writer that opened it just before sees the file replaced and refuses, so two never hold it)."""
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    target = Path(out)
    path = Path(lock) if lock is not None else target.parent / f".{target.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            current = os.stat(path).st_ino if path.exists() else None
        except BlockingIOError:
            current = -1
        if current != os.fstat(handle.fileno()).st_ino:  # held, or released and removed since we opened it
            handle.seek(0)
            pid, _, who = (handle.read().strip() or "unknown").partition(" ")
            raise FileExistsError(
                f"{target}: another {who or command} is writing here (pid {pid}); use another {flag}"
            ) from None
        try:  # the first file a command writes: on a full disk it fails here, once (unbuffered), and goes
            with writing(path):
                handle.seek(0)
                handle.truncate()
                os.write(handle.fileno(), f"{os.getpid()} {command}".encode())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        try:
            yield
        finally:
            path.unlink(missing_ok=True)  # removed while held: a writer that opened it before sees the inode change
            fcntl.flock(handle, fcntl.LOCK_UN)
