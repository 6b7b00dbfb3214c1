"""LACUNA's released data directory, read as published.

The authors' ``scripts/download_artifacts.py`` (McGill-NLP/LACUNA at commit 93800b0) writes, per model size and
regime, ``<root>/<size>/data-<regime>/`` holding

* ``README.md``: a Hugging Face dataset card whose YAML front matter lists
  ``configs: [{config_name, data_files: [{split, path}]}]``, so that ``datasets.load_dataset(dir, name=<Config>,
  split=<split>)`` reads it (``src/data/UnlearningData.py``);
* ``data/<Config>_<split>.parquet``: configs ``Email_Address``, ``Phone_Number``, ``Birth_City``, ``Drivers_License``,
  ``validation_Email_Address`` and ``validation_Drivers_License``, each with splits ``forget``, ``retain``,
  ``forget_paraphrased``, ``retain_paraphrased`` and ``full``, plus ``relearn_train.parquet`` (config ``relearn``,
  split ``train``). Columns ``ID`` (string), ``question`` (the raw prompt), ``answer``, ``field`` (strings such as
  ``"Driver's License"``) and ``group_id`` (int32), as ``src/create_memorized_datasets.py`` writes them.

:func:`find_release` recognises such a directory (or its ``data/`` subfolder); :func:`read_release` maps its configs
onto lacuna-bench's splits (:data:`~lacuna_tasks.schema.SPLITS`):

* the four field configs' ``forget`` / ``retain`` / ``forget_paraphrased`` / ``retain_paraphrased`` files are
  concatenated (in :data:`~lacuna_tasks.schema.FIELDS` order) into the split of the same name; the ``field`` column
  then selects a field, as in lacuna-bench's own layout;
* ``validation_<Field>`` ``forget`` and ``retain`` (the validation people, one memorized question each) become
  ``validation``; their ``_paraphrased`` twins have no lacuna-bench split and are not used;
* ``relearn`` ``train`` becomes ``relearn``;
* every ``full`` split (the union of a config's main and paraphrased rows) is recognised and not used.

The card decides which file is which config and split; without a card (or one that lists no configs) the files in
``data/`` are classified by name, as the authors' script does. A field config and its four forget / retain splits are
required; validation and relearn configs are optional (the authors' code writes them only when it has such people).
Every problem raises a one-line :class:`~lacuna_tasks.schema.LacunaDataError` naming the file (docs/tasks.md,
"LACUNA's released data").
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lacuna_tasks.schema import FIELDS, QA_COLUMNS, LacunaDataError, validate_rows

CARD_NAME = "README.md"
DATA_SUBDIR = "data"
#: A field's config name in the release: its column with spaces as underscores and the apostrophe dropped.
FIELD_CONFIGS: dict[str, str] = {f.config: f.column for f in FIELDS.values()}
VALIDATION_PREFIX = "validation_"
RELEARN_CONFIG = "relearn"
#: The release's split names, most specific first: ``<Config>_<split>.parquet`` is classified by its longest match.
RELEASE_SPLITS: tuple[str, ...] = ("forget_paraphrased", "retain_paraphrased", "forget", "retain", "full", "train")
#: The columns of every release file and their published Arrow types.
RELEASE_COLUMNS: dict[str, str] = {
    "ID": "string",
    "question": "string",
    "answer": "string",
    "field": "string",
    "group_id": "int32",
}
#: Release split of a field config -> lacuna-bench split (None: recognised, not used).
FIELD_SPLITS: dict[str, str | None] = {
    "forget": "forget",
    "retain": "retain",
    "forget_paraphrased": "forget_paraphrased",
    "retain_paraphrased": "retain_paraphrased",
    "full": None,
}
#: Release split of a ``validation_<Field>`` config -> lacuna-bench split.
VALIDATION_SPLITS: dict[str, str | None] = {
    "forget": "validation",
    "retain": "validation",
    "forget_paraphrased": None,
    "retain_paraphrased": None,
    "full": None,
}
#: Release split of the ``relearn`` config -> lacuna-bench split.
RELEARN_SPLITS: dict[str, str | None] = {"train": "relearn"}
#: Splits every field config must have, and that a validation config must have when it is present.
REQUIRED_FIELD_SPLITS: tuple[str, ...] = ("forget", "retain", "forget_paraphrased", "retain_paraphrased")
REQUIRED_VALIDATION_SPLITS: tuple[str, ...] = ("forget", "retain")

_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class ReleaseDir:
    """Where a release's data is: ``root`` (``data-<regime>``), its parquet folder and its card (None: no card)."""

    root: Path
    data_dir: Path
    card: Path | None


@dataclass(frozen=True)
class ReleaseFile:
    """One parquet file of the release: its config and release split, and what lacuna-bench makes of it."""

    config: str
    split: str
    path: Path

    @property
    def column(self) -> str | None:
        """The ``field`` value of every row (None for ``relearn``, which mixes fields)."""
        return FIELD_CONFIGS.get(self.config.removeprefix(VALIDATION_PREFIX)) if self.config != RELEARN_CONFIG else None

    @property
    def target(self) -> str | None:
        """The lacuna-bench split the rows go to (None: recognised, not used)."""
        return _split_table(self.config)[self.split]


@dataclass
class ReleaseData:
    """The mapped splits, each split's files in order with their row counts, and the provenance record."""

    splits: dict[str, list[dict[str, Any]]]
    parts: dict[str, list[tuple[str, int]]]
    info: dict[str, Any] = field(default_factory=dict)


def known_configs() -> list[str]:
    """Every config name the release may hold, in the order lacuna-bench concatenates them."""
    return [*FIELD_CONFIGS, *(VALIDATION_PREFIX + c for c in FIELD_CONFIGS), RELEARN_CONFIG]


def _split_table(config: str) -> dict[str, str | None]:
    if config in FIELD_CONFIGS:
        return FIELD_SPLITS
    if config.startswith(VALIDATION_PREFIX) and config.removeprefix(VALIDATION_PREFIX) in FIELD_CONFIGS:
        return VALIDATION_SPLITS
    if config == RELEARN_CONFIG:
        return RELEARN_SPLITS
    raise KeyError(config)


def classify(name: str) -> tuple[str, str] | None:
    """``(config, split)`` of a file named ``<config>_<split>.parquet`` (longest split suffix first), else None."""
    if not name.endswith(".parquet"):
        return None
    stem = name[: -len(".parquet")]
    for split in RELEASE_SPLITS:
        if stem.endswith("_" + split) and len(stem) > len(split) + 1:
            return stem[: -len(split) - 1], split
    return None


def _release_files_in(folder: Path) -> list[Path]:
    """The parquet files of ``folder`` whose names are a known release config and split."""
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.parquet")):
        found = classify(path.name)
        if found is not None and found[0] in known_configs():
            out.append(path)
    return out


def _card_lists_configs(card: Path) -> bool:
    """Whether ``card`` has YAML front matter naming ``configs`` (a front matter that does not parse counts: reading
    it then fails naming the card)."""
    if not card.is_file():
        return False
    try:
        text = card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return True  # read_release names the card and the reason
    front = _front_matter(text)
    return front is not None and re.search(r"^configs\s*:", front, re.MULTILINE) is not None


def find_release(path: Path) -> ReleaseDir | None:
    """The release data directory ``path`` is (``data-<regime>``, with its card and ``data/``), or whose ``data/``
    subfolder it is; None if ``path`` holds neither."""
    path = Path(path)
    card = path / CARD_NAME
    if _release_files_in(path / DATA_SUBDIR) or _card_lists_configs(card):
        return ReleaseDir(root=path, data_dir=path / DATA_SUBDIR, card=card if card.is_file() else None)
    if _release_files_in(path):  # the data/ subfolder itself (or a folder of release files without a card)
        root = path.parent if path.name == DATA_SUBDIR else path
        card = root / CARD_NAME
        return ReleaseDir(root=root, data_dir=path, card=card if card.is_file() else None)
    return None


def watched_files(release: ReleaseDir) -> list[Path]:
    """The files whose change invalidates a cached load: the card and every file of the parquet folder."""
    files = [release.card] if release.card is not None else []
    if release.data_dir.is_dir():
        files += sorted(p for p in release.data_dir.iterdir() if p.is_file())
    return files


# -- the card ---------------------------------------------------------------------------------------------------


def _front_matter(text: str) -> str | None:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() == "---":
            return "\n".join(lines[1:i])
    return None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _card_entries(release: ReleaseDir) -> list[tuple[str, str, list[Path]]] | None:
    """``(config, split, files)`` as the card lists them; None if the card lists no configs."""
    import yaml

    card = release.card
    assert card is not None
    try:
        text = card.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LacunaDataError(f"{card}: not UTF-8 text; expected a dataset card (README.md)") from None
    except OSError as exc:
        raise LacunaDataError(f"{card}: cannot read: {exc.strerror or exc}") from None
    front = _front_matter(text)
    if front is None:
        return None
    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError as exc:
        raise LacunaDataError(f"{card}: malformed YAML front matter ({_one_line(exc)})") from None
    if not isinstance(meta, dict) or meta.get("configs") is None:
        return None
    configs = meta["configs"]
    if not isinstance(configs, list):
        raise LacunaDataError(f"{card}: 'configs' must be a list of {{config_name, data_files}}, got {configs!r}")
    entries: list[tuple[str, str, list[Path]]] = []
    for i, item in enumerate(configs):
        if not isinstance(item, dict) or not isinstance(item.get("config_name"), str) or "data_files" not in item:
            raise LacunaDataError(f"{card}: configs[{i}] must have a config_name and data_files, got {item!r}")
        name = item["config_name"]
        for split, patterns in _data_files(card, name, item["data_files"]):
            entries.append((name, split, [_resolve(release, card, name, split, p) for p in patterns]))
    return entries


def _data_files(card: Path, config: str, data_files: Any) -> list[tuple[str, list[str]]]:
    """``data_files`` in the forms a dataset card may use: a path, a list of paths (split ``train``), a mapping
    split -> path(s), or a list of ``{split, path}``."""

    def paths(value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return list(value)
        raise LacunaDataError(f"{card}: config {config!r}: data_files paths must be strings, got {value!r}")

    if isinstance(data_files, str) or (isinstance(data_files, list) and all(isinstance(v, str) for v in data_files)):
        return [("train", paths(data_files))]
    if isinstance(data_files, dict):
        return [(str(split), paths(value)) for split, value in data_files.items()]
    if isinstance(data_files, list):
        out = []
        for entry in data_files:
            if not isinstance(entry, dict) or "split" not in entry or "path" not in entry:
                raise LacunaDataError(
                    f"{card}: config {config!r}: each data_files entry needs a split and a path, got {entry!r}"
                )
            out.append((str(entry["split"]), paths(entry["path"])))
        return out
    raise LacunaDataError(f"{card}: config {config!r}: data_files must be a path or a list, got {data_files!r}")


def _resolve(release: ReleaseDir, card: Path, config: str, split: str, pattern: str) -> Path:
    where = f"{card}: config {config!r} split {split!r} names {pattern}"
    if _GLOB.search(pattern):
        matches = sorted(glob.glob(str(release.root / pattern)))
        if not matches:
            raise LacunaDataError(f"{where}, which matches no file in {release.root}")
        if len(matches) > 1:
            raise LacunaDataError(f"{where}, which matches {len(matches)} files; LACUNA's release has one per split")
        return Path(matches[0])
    path = release.root / pattern
    if not path.is_file():
        raise LacunaDataError(f"{where}, but {path} does not exist")
    return path


# -- reading ----------------------------------------------------------------------------------------------------


def _filename_entries(release: ReleaseDir) -> tuple[list[tuple[str, str, list[Path]]], list[str]]:
    """Files of the parquet folder classified by name (``<Config>_<split>.parquet``), and the names that are not."""
    entries, ignored = [], []
    files = sorted(release.data_dir.glob("*.parquet")) if release.data_dir.is_dir() else []
    for path in files:
        found = classify(path.name)
        if found is None:
            ignored.append(path.name)
        else:
            entries.append((found[0], found[1], [path]))
    return entries, ignored


def _expected_file(release: ReleaseDir, config: str, split: str) -> Path:
    return release.data_dir / f"{config}_{split}.parquet"


def _release_files(release: ReleaseDir) -> tuple[list[ReleaseFile], str, list[str]]:
    """Every file of the release with its config and split, how they were classified, and what was ignored (files
    whose name or card entry is no config and split of LACUNA's release, as the authors' script skips them)."""
    entries = _card_entries(release) if release.card is not None else None
    how, ignored = "card", []
    if entries is None:
        entries, ignored = _filename_entries(release)
        how = "file names"
    configs = known_configs()
    files: list[ReleaseFile] = []
    seen: dict[tuple[str, str], Path] = {}
    for config, split, paths in entries:
        if config not in configs or split not in _split_table(config):
            ignored += [_relative(p, release.root) for p in paths]
            continue
        for path in paths:
            if (config, split) in seen:
                raise LacunaDataError(
                    f"{path}: a second file for config {config!r} split {split!r} (also {seen[(config, split)]}); "
                    "LACUNA's release has one file per config and split"
                )
            seen[(config, split)] = path
            files.append(ReleaseFile(config, split, path))
    _check_required(release, {(f.config, f.split) for f in files}, how, ignored)
    order = {c: i for i, c in enumerate(configs)}
    files.sort(key=lambda f: (order[f.config], RELEASE_SPLITS.index(f.split)))
    return files, how, ignored


def _check_required(release: ReleaseDir, present: set[tuple[str, str]], how: str, ignored: list[str]) -> None:
    """Every field config with its four forget / retain splits; a validation config, if any, with forget and
    retain. A missing one names the file the release would hold."""
    where = f"listed in {release.card}" if how == "card" else f"in {release.data_dir}"
    found = sorted({c for c, _ in present})
    note = f"found configs: {', '.join(found) or 'none'}"
    if ignored:
        shown = ", ".join(ignored[:4]) + (f", ... ({len(ignored) - 4} more)" if len(ignored) > 4 else "")
        note += f"; ignored, as no config and split of the release: {shown}"
    for config in known_configs():
        if config in FIELD_CONFIGS:
            required = REQUIRED_FIELD_SPLITS
        elif config != RELEARN_CONFIG and config in found:
            required = REQUIRED_VALIDATION_SPLITS
        else:
            continue  # validation and relearn configs are optional
        for split in required:
            if (config, split) in present:
                continue
            expected = _expected_file(release, config, split)
            if config not in found:
                raise LacunaDataError(
                    f"{expected}: missing: LACUNA's release data {release.root} has no config {config!r} {where} "
                    f"({note}); expected the four field configs {', '.join(FIELD_CONFIGS)}, each with splits "
                    f"{', '.join(REQUIRED_FIELD_SPLITS)}"
                )
            kind = "field" if config in FIELD_CONFIGS else "validation"
            raise LacunaDataError(
                f"{expected}: missing: config {config!r} of LACUNA's release data {release.root} has no split "
                f"{split!r} {where} ({note}); a {kind} config needs splits {', '.join(required)}"
            )


def _check_schema(file: ReleaseFile, schema: Any) -> None:
    import pyarrow as pa

    names = list(schema.names)
    missing = [c for c in QA_COLUMNS if c not in names]
    if missing:
        lower = {n.lower(): n for n in names}
        hints = [f"{lower[c.lower()]!r} instead of {c!r}" for c in missing if c.lower() in lower]
        hint = f" ({'; '.join(hints)}: column names are case-sensitive)" if hints else ""
        raise LacunaDataError(
            f"{file.path}: missing column(s) {missing}{hint}; found columns {names}; LACUNA's release files have "
            + ", ".join(f"{c} ({t})" for c, t in RELEASE_COLUMNS.items())
        )
    group = schema.field("group_id").type
    if not pa.types.is_integer(group):
        raise LacunaDataError(
            f"{file.path}: column 'group_id' has type {group}, expected an integer (int32 in LACUNA's release)"
        )
    for column in ("question", "answer", "field"):
        kind = schema.field(column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise LacunaDataError(f"{file.path}: column {column!r} has type {kind}, expected string")
    kind = schema.field("ID").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)):
        raise LacunaDataError(f"{file.path}: column 'ID' has type {kind}, expected string")


def _read_table(path: Path) -> Any:
    import pyarrow.parquet as pq

    return _parquet(path, pq.read_table)


def _parquet(path: Path, read: Any) -> Any:
    """``read(path)`` (pyarrow's table or schema reader), any failure as one line naming the file."""
    try:
        return read(path)
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or _one_line(exc)
        raise LacunaDataError(f"{path}: unreadable parquet file ({reason})") from None
    except Exception as exc:  # pyarrow raises ArrowInvalid and others on garbage bytes
        raise LacunaDataError(f"{path}: unreadable parquet file ({_one_line(exc)})") from None


def _read_rows(file: ReleaseFile) -> list[dict[str, Any]]:
    table = _read_table(file.path)
    _check_schema(file, table.schema)
    rows = table.to_pylist()
    column = file.column
    for i, row in enumerate(rows):
        if column is not None and row["field"] != column:
            raise LacunaDataError(
                f"{file.path}: row {i} has field {row['field']!r}, but config {file.config!r} holds {column!r} rows"
            )
    return validate_rows(rows, source=str(file.path), split=file.target or file.split)


def read_release(release: ReleaseDir) -> ReleaseData:
    """The release's rows mapped onto lacuna-bench's splits (module docstring), each file checked (columns and their
    types, the config's field, :func:`~lacuna_tasks.schema.validate_rows`); the relations across splits are the
    loader's (:func:`lacuna_tasks.validate.validate_dataset`)."""
    files, how, ignored = _release_files(release)
    splits: dict[str, list[dict[str, Any]]] = {}
    parts: dict[str, list[tuple[str, int]]] = {}
    record: dict[str, dict[str, Any]] = {}
    for file in files:
        key = f"{file.config}/{file.split}"
        rel = _relative(file.path, release.root)
        if file.target is None:
            _check_schema(file, _read_schema(file.path))
            record[key] = {"file": rel, "split": None}
            continue
        rows = _read_rows(file)
        splits.setdefault(file.target, []).extend(rows)
        parts.setdefault(file.target, []).append((str(file.path), len(rows)))
        record[key] = {"file": rel, "split": file.target, "rows": len(rows)}
    info = {
        "layout": "lacuna-release",
        "card": str(release.card) if how == "card" else None,
        "classified_by": how,
        "configs": record,
        "unused": [k for k, v in record.items() if v["split"] is None],
        "ignored": ignored,
    }
    return ReleaseData(splits=splits, parts=parts, info=info)


def _read_schema(path: Path) -> Any:
    import pyarrow.parquet as pq

    return _parquet(path, pq.read_schema)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def describe(entries: Iterable[Path], limit: int = 6) -> str:
    """What a directory holds, in a few words, for 'found ...' in an error message."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in entries)
    if not names:
        return "it is empty"
    shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
    return f"found {len(names)} entr{'y' if len(names) == 1 else 'ies'}: {shown}"
