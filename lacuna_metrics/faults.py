"""File-system faults (a full disk, a file size limit, a symlink loop, a denied read) as one line naming the file.

A full disk's ``OSError`` names no file (``write`` and ``close`` raise it), safetensors reports its I/O errors as
text and a staging directory is gone by the time its error is read: :func:`writing` and :func:`naming_outputs`
put the output's own path on the error where it is raised, and :func:`error_line` is what every command prints.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FAULTS", "error_line", "fault_errno", "naming_outputs", "symlink_loop", "symlink_loop_error", "writing"]

#: errno -> the cause as a command prints it
FAULTS: dict[int, str] = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (over the file size limit, ulimit -f)",
    errno.EROFS: "read-only file system",
    errno.ELOOP: "symlink loop (too many levels of symbolic links)",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error",
}
#: causes that only a write meets: the message says which file could not be written
_WRITE_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


#: torch.save's zip writer failing a write (a full disk, a file size limit): its message keeps no errno
#: ("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598", "... file write failed")
_TORCH_WRITE_FAILED = re.compile(r"inline_container\.cc.*(unexpected pos|file write failed)|PytorchStreamWriter failed")


def fault_errno(exc: BaseException) -> int | None:
    """The errno behind ``exc``: an OSError's, or the ``(os error N)`` a native writer (safetensors) puts in its
    message, or EIO for torch.save's failed write (the HF Trainer's checkpoints), which keeps none; None for
    anything else."""
    if isinstance(exc, OSError):
        return exc.errno
    match = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(exc))
    if match:
        return int(match.group(1) or match.group(2))
    return errno.EIO if isinstance(exc, RuntimeError) and _TORCH_WRITE_FAILED.search(str(exc)) else None


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Errors of writing ``path`` name it: a fault of :data:`FAULTS` (an OSError without a file name, or a native
    writer's I/O error) becomes ``OSError(errno, strerror, path)`` (its subclass by errno), the original chained.
    Other errors pass unchanged, so a block that does more than write is not blamed on ``path``."""
    try:
        yield
    except Exception as exc:
        code = fault_errno(exc)
        if code not in FAULTS or getattr(exc, "filename", None) is not None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from exc


@contextmanager
def naming_outputs(staging: str | os.PathLike[str], out: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError naming a file inside ``staging`` (``OUT.partial``, ``OUT/.staging-*``) names its place in ``out``
    instead: the staging directory is removed before anyone reads the message."""
    try:
        yield
    except OSError as exc:
        inside = exc.filename is not None and exc.errno is not None and Path(str(exc.filename)).is_relative_to(staging)
        if not inside:
            raise
        relative = Path(str(exc.filename)).relative_to(staging)
        raise OSError(exc.errno, exc.strerror, str(Path(out) / relative)) from exc


def symlink_loop(path: str | os.PathLike[str]) -> Path | None:
    """The first of ``path`` and its ancestors that is a symlink loop (``a -> b``, ``b -> a``), None when none is.
    ``Path.exists`` answers False for such a path, so a check that walks up to the first existing ancestor would
    pass it and fail only at the first write."""
    path = Path(path)
    for candidate in (*reversed(path.parents), path):
        try:
            os.stat(candidate)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return candidate
            return None  # missing: nothing below it can loop either
    return None


def symlink_loop_error(label: str, path: str | os.PathLike[str]) -> str | None:
    """The one-line refusal of a path through a symlink loop (``label``: how the command names it, e.g.
    ``--out runs/x``), None when ``path`` has none: one wording for every command's check before any work."""
    loop = symlink_loop(path)
    return None if loop is None else f"{label}: {loop} is a {FAULTS[errno.ELOOP]}"


def error_line(exc: BaseException) -> str | None:
    """The one line a command prints for ``exc``: a bad input (ValueError, our messages name the culprit) or a
    file-system fault (OSError, or a native writer's I/O error), the file first. None for anything else: a bug,
    whose traceback should show."""
    if isinstance(exc, OSError):
        if exc.filename is None or exc.strerror is None:
            return str(exc)  # our own OSError("--out X: ...") messages, or a fault that names no file
        code = exc.errno
        cause = FAULTS.get(code) or exc.strerror[:1].lower() + exc.strerror[1:]
        name = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return f"cannot write {name}: {cause}" if code in _WRITE_FAULTS else f"{name}: {cause}"
    if isinstance(exc, ValueError):
        return str(exc)
    code = fault_errno(exc)
    if code is None:
        return None
    return f"{FAULTS.get(code) or os.strerror(code)}: {str(exc).strip().splitlines()[0]}"
