"""One loader for every LACUNA data source.

A source is one of:

* the dataset bundled with the package (the default: ``lacuna_tasks/data/default``);
* a local directory of ``<split>.jsonl`` / ``<split>.parquet`` files in the schema of
  :mod:`lacuna_tasks.schema` (what ``lacuna data generate`` and the testbed builder write),
  optionally with ``profiles.jsonl``; a testbed directory whose ``data/`` holds those files works too;
* a ``datasets`` ``DatasetDict`` saved with ``save_to_disk`` whose split names are lacuna-bench's
  (:data:`~lacuna_tasks.schema.SPLITS`): a convenience, not the layout LACUNA publishes;
* LACUNA's released data directory as ``scripts/download_artifacts.py`` writes it, ``<size>/data-<regime>/``
  (a dataset card and ``data/<Config>_<split>.parquet``), or its ``data/`` subfolder: read by
  :mod:`lacuna_tasks.release_data`, which maps its configs onto these splits (docs/tasks.md, "LACUNA's
  released data").

Besides LACUNA's splits, a source may hold the held-out ``retain_eval`` / ``retain_eval_paraphrased``
splits (:data:`~lacuna_tasks.validate.RETAIN_EVAL_SPLITS`); older data lacks them, and
:meth:`LacunaData.has_split` lets a task skip instead of failing.

The source is chosen per run: lm-eval ``--metadata '{"lacuna_data": "DIR"}'``, else the environment
variable ``LACUNA_DATA``, else the bundled default. Every load carries a content fingerprint
(SHA-256 over the canonical JSON of all splits), recorded in each result.

Every load is validated before any task sees it: each row against the schema
(:func:`lacuna_tasks.schema.validate_rows`), then the relations between rows and splits
(:mod:`lacuna_tasks.validate`: unique person IDs, one ID = one person, agreement with the profiles,
disjoint forget/retain people, held-out validation and relearn people).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lacuna_tasks.release_data import ReleaseDir, describe, find_release, read_release, watched_files
from lacuna_tasks.schema import SPLITS, LacunaDataError, get_field, validate_rows
from lacuna_tasks.validate import RETAIN_EVAL_SPLITS, index_profiles, validate_dataset

ENV_VAR = "LACUNA_DATA"
METADATA_KEY = "lacuna_data"
BUNDLED_DIR = Path(__file__).parent / "data" / "default"
BUNDLED_NAME = "bundled:default"
#: Every split name a source may hold: LACUNA's, then the optional held-out retain-eval splits.
KNOWN_SPLITS: tuple[str, ...] = (*SPLITS, *RETAIN_EVAL_SPLITS)

#: What a missing profiles table means for the extraction probe, and how to supply it (LACUNA's release has none).
NO_PROFILES_HINT = (
    " (LACUNA's release ships none: put PANORAMA-Plus's profiles, srirxml/PANORAMA-Plus, as profiles.jsonl or "
    "profiles.parquet beside the data's README.md card; docs/tasks.md)"
)

_CACHE: dict[tuple, LacunaData] = {}


@dataclass
class LacunaData:
    """QA splits (validated) plus the optional profiles table, with provenance."""

    source: str
    fingerprint: str
    splits: dict[str, list[dict[str, Any]]]
    profiles: dict[str, dict[str, Any]] | None = None
    #: split -> the file it was read from; for LACUNA's release, its parquet files in order, joined by ", "
    files: dict[str, str] = field(default_factory=dict)
    #: LACUNA's release only: how its files were classified and mapped (:func:`lacuna_tasks.release_data.read_release`)
    release: dict[str, Any] | None = None

    def rows(self, split: str, field_name: str | None = None) -> list[dict[str, Any]]:
        """Rows of ``split`` (optionally one field); fails if the split is missing or empty."""
        if split not in self.splits:
            raise LacunaDataError(
                f"{self.source}: no split {split!r} (found: {sorted(self.splits)}); expected files like {split}.jsonl"
            )
        rows = self.splits[split]
        if field_name is not None:
            column = get_field(field_name).column
            rows = [r for r in rows if r["field"] == column]
            if not rows:
                raise LacunaDataError(
                    f"{self.source}: split {split!r} ({self.files.get(split, split)}) has no rows for field {column!r}"
                )
        elif not rows:
            raise LacunaDataError(f"{self.source}: split {split!r} ({self.files.get(split, split)}) is empty")
        return rows

    def has_split(self, split: str) -> bool:
        """Whether the source holds ``split`` (the optional retain-eval splits are absent from older data)."""
        return split in self.splits

    def provenance(self) -> dict[str, Any]:
        """Source and content fingerprint; for LACUNA's release also its layout and the configs not used."""
        out: dict[str, Any] = {"source": self.source, "fingerprint": self.fingerprint}
        if self.release is not None:
            out["layout"] = self.release["layout"]
            out["unused"] = self.release["unused"]
        return out


def resolve_source(metadata: Mapping[str, Any] | None = None) -> str:
    """The data source for this run: metadata ``lacuna_data`` > ``$LACUNA_DATA`` > bundled default."""
    value = (metadata or {}).get(METADATA_KEY) or os.environ.get(ENV_VAR) or BUNDLED_NAME
    return str(value)


def load_data(source: str | os.PathLike | None = None) -> LacunaData:
    """Load and validate a LACUNA data source (cached per path and file modification times)."""
    name = str(source) if source is not None else BUNDLED_NAME
    path = BUNDLED_DIR if name == BUNDLED_NAME else Path(name).expanduser()
    given = path
    if not path.exists():
        raise LacunaDataError(
            f"LACUNA data path {str(path)!r} does not exist (set via --metadata lacuna_data or ${ENV_VAR})"
        )
    if not path.is_dir():
        raise LacunaDataError(f"LACUNA data path {str(path)!r} is not a directory")
    release = None
    if not _split_files(path) and not (path / "dataset_dict.json").exists():
        release = find_release(path.resolve())
        if release is None and (path / "data").is_dir():
            path = path / "data"  # a testbed directory
    if release is not None:
        watched = watched_files(release)
        key = (str(release.root), "release", tuple((str(p), *_stat(p)) for p in watched))
        if key not in _CACHE:
            _CACHE[key] = _load_release(release)
        return _CACHE[key]
    path = path.resolve()
    stamp = tuple(sorted((p.name, *_stat(p)) for p in path.iterdir() if p.is_file()))
    key = (str(path), stamp)
    if key not in _CACHE:
        display = BUNDLED_NAME if path == BUNDLED_DIR.resolve() else str(path)
        _CACHE[key] = _load_dir(path, display, given)
    return _CACHE[key]


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _split_files(path: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for split in KNOWN_SPLITS:
        for suffix in (".jsonl", ".parquet"):
            candidate = path / f"{split}{suffix}"
            if candidate.is_file():
                found[split] = candidate
                break
    return found


def _load_release(release: ReleaseDir) -> LacunaData:
    """LACUNA's released data directory, mapped onto lacuna-bench's splits and validated like every source."""
    data = read_release(release)
    files = {split: ", ".join(file for file, _ in parts) for split, parts in data.parts.items()}
    # The release ships no profiles; LACUNA's extraction script reads PANORAMA-Plus's from the hub. A user who puts
    # them beside the card (profiles.jsonl / .parquet) gives the extraction probe its questions (docs/tasks.md).
    profiles, profiles_file = _profiles(release.root)
    validate_dataset(data.splits, files, profiles, str(profiles_file), parts=data.parts)
    return LacunaData(
        source=str(release.root),
        fingerprint=fingerprint(data.splits),
        splits=data.splits,
        profiles=profiles,
        files=files,
        release=data.info,
    )


def _profiles(path: Path) -> tuple[dict[str, dict[str, Any]] | None, Path | None]:
    """The profiles table of a data directory (``profiles.jsonl``, else ``profiles.parquet``), by person ID."""
    for name in ("profiles.jsonl", "profiles.parquet"):
        if (path / name).is_file():
            return index_profiles(read_rows(path / name), str(path / name)), path / name
    return None, None


def _load_dir(path: Path, display: str, given: Path | None = None) -> LacunaData:
    files = _split_files(path)
    splits: dict[str, list[dict[str, Any]]] = {}
    if files:
        for split, file in files.items():
            splits[split] = validate_rows(read_rows(file), source=str(file), split=split)
    elif (path / "dataset_dict.json").exists():
        import datasets

        try:
            dd = datasets.load_from_disk(str(path))
        except Exception as exc:
            raise LacunaDataError(f"{path}: not a readable datasets DatasetDict ({exc})") from exc
        for split in dd:
            if split in KNOWN_SPLITS:
                splits[split] = validate_rows(dd[split].to_list(), source=str(path / split), split=split)
                files[split] = path / split
    if not splits:
        looked = given if given is not None else path
        found = describe(looked.iterdir())
        if looked.resolve() != path:
            found += f"; in its data/ {describe(path.iterdir()).replace('it is empty', 'nothing')}"
        raise LacunaDataError(
            f"{looked}: no LACUNA splits found ({found}); expected lacuna-bench's layout, files "
            f"<split>.jsonl or <split>.parquet for splits {list(KNOWN_SPLITS)} (in the directory or its data/; or a "
            "DatasetDict saved with save_to_disk), or LACUNA's released data directory <size>/data-<regime>/ "
            "(README.md dataset card and data/<Config>_<split>.parquet, e.g. data/Email_Address_forget.parquet)"
            + _releases_inside(looked)
        )
    profiles, profiles_file = _profiles(path)
    # Relations across rows and splits (unique IDs, one ID = one person, profile agreement, disjoint
    # sides and held-out people), checked before any task builds documents from the data.
    validate_dataset(splits, {s: str(f) for s, f in files.items()}, profiles, str(profiles_file))
    return LacunaData(
        source=display,
        fingerprint=fingerprint(splits),
        splits=splits,
        profiles=profiles,
        files={s: str(f) for s, f in files.items()},
    )


def _releases_inside(path: Path) -> str:
    """A hint for the parent of release data directories (``<size>/``, holding ``data-masked/``...)."""
    inside = sorted(str(p) for p in path.iterdir() if p.is_dir() and find_release(p) is not None)
    return f"; LACUNA's release data is in {', '.join(inside)}: pass one of those" if inside else ""


def read_rows(file: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL or parquet file; malformed lines raise LacunaDataError naming file and line."""
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(file).to_pylist()
        except Exception as exc:
            raise LacunaDataError(f"{file}: unreadable parquet file ({exc})") from exc
    rows = []
    for lineno, row in jsonl_lines(file):
        if not isinstance(row, dict):
            raise LacunaDataError(f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def jsonl_lines(file: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line of a JSONL file; malformed JSON raises
    LacunaDataError naming file and line, and so does a file that cannot be read (:func:`reading`)."""
    with reading(file), file.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise LacunaDataError(f"{file}:{lineno}: malformed JSON ({exc.msg})") from None


@contextmanager
def reading(file: str | os.PathLike[str]) -> Iterator[None]:
    """Around reading the text file ``file``: a read error (permission denied, a symlink loop, a disk error) or
    bytes that are not UTF-8 become a LacunaDataError naming the file (and the line and byte offset of the first
    bad byte), which every command and the ``lm_eval`` hook print as one line; Python's own errors name neither."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise LacunaDataError(_not_utf8(Path(file), exc)) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise LacunaDataError(f"{file}: cannot read: {reason[:1].lower()}{reason[1:]}") from None


def _not_utf8(file: Path, exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 is (read again as bytes: a text reader's offset counts from its last
    buffer); only on the error path, so it costs nothing when the file is good."""
    try:
        data = file.read_bytes()
        data.decode("utf-8")
    except UnicodeDecodeError as whole:
        line = data.count(b"\n", 0, whole.start) + 1
        return (
            f"{file}:{line}: not UTF-8 text (byte offset {whole.start}: {whole.reason}, 0x{data[whole.start]:02x}); "
            "save the file as UTF-8"
        )
    except OSError:
        pass
    return f"{file}: not UTF-8 text ({exc.reason}); save the file as UTF-8"


def fingerprint(splits: Mapping[str, list[Mapping[str, Any]]]) -> str:
    """SHA-256 over the canonical JSON of the splits (independent of file format and key order)."""
    digest = hashlib.sha256()
    for split in sorted(splits):
        digest.update(split.encode())
        for row in splits[split]:
            digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode("utf-8"))
            digest.update(b"\n")
    return "sha256:" + digest.hexdigest()
