"""Content fingerprints of files and directory trees, with a cache keyed by what ``stat`` says of each file.

A cache of stages (``lacuna run``) must key on the content of what a stage reads and verify what it reuses, or an
edited testbed or a corrupted cached model is served silently. Hashing every byte on every run would cost a
7B testbed tens of seconds, so each file's SHA-256 is remembered under its (path, device, inode, size, mtime):
any write to the file changes its mtime or size and so its entry. The cache lives in ``$LACUNA_CACHE``
(default ``~/.cache/lacuna-bench``) under ``fingerprints/``, one small file per entry, written atomically, so
concurrent processes never corrupt it; ``LACUNA_FINGERPRINT_CACHE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["file_digest", "tree_fingerprint"]

_CHUNK = 8 << 20


def _cache_dir() -> Path | None:
    if os.environ.get("LACUNA_FINGERPRINT_CACHE", "1").strip() == "0":
        return None
    root = Path(os.environ.get("LACUNA_CACHE", Path.home() / ".cache" / "lacuna-bench"))
    return root / "fingerprints"


def file_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:…`` of a file's bytes, from the cache when the file's stat is unchanged."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = json.dumps([str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns])
    cache = _cache_dir()
    entry = cache / hashlib.sha256(stamp.encode()).hexdigest() if cache is not None else None
    if entry is not None:
        try:
            return entry.read_text()
        except OSError:
            pass
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    value = "sha256:" + digest.hexdigest()
    if entry is not None:
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
            tmp.write_text(value)
            os.replace(tmp, entry)
        except OSError:
            pass  # an unwritable cache only costs the next run a re-hash
    return value


def tree_fingerprint(root: str | os.PathLike[str], exclude: Iterable[str] = ()) -> str:
    """``sha256:…`` of every file under ``root`` (relative path and content; file order and mtimes do not
    count), leaving out the relative paths in ``exclude`` and hidden lock files (``.*.lock``)."""
    root = Path(root)
    skip = set(exclude)
    listing = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel in skip or (path.name.startswith(".") and path.name.endswith(".lock")):
            continue
        listing.append([rel, file_digest(path)])
    return "sha256:" + hashlib.sha256(json.dumps(listing).encode()).hexdigest()
