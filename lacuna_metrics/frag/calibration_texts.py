"""The calibration texts FRAG's activation norms are measured on: the first rows of a LACUNA split, or a file.

Which texts (and which fields they were selected by) is part of the activation cache key, so it has one home.
Definitions: ``docs/definitions.md#frag-activation-statistics``; field selection: docs/scoring.md ("FRAG calibration
fields").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["calibration_fields", "calibration_texts"]


def calibration_fields(fields: str | Sequence[str] | None) -> list[str] | None:
    """Field keys (``email``, ...) of ``fields`` (keys or PANORAMA columns), in order, each once; None and ``all``
    (every field, no selection) give None.

    ValueError naming the known fields for an unknown one, and for an empty selection.
    """
    if fields is None or fields == "all":
        return None
    from lacuna_tasks import get_field

    if isinstance(fields, str):
        fields = [fields]
    if "all" in fields:
        return None
    keys: list[str] = []
    for name in fields:
        key = get_field(str(name)).key  # LacunaDataError (a ValueError) naming the known fields
        if key not in keys:
            keys.append(key)
    if not keys:
        raise ValueError("calibration fields: an empty selection (give None for every field)")
    return keys


def calibration_texts(
    source: str | os.PathLike[str] | None, split: str, n: int = 128, *, fields: Sequence[str] | None = None
) -> list[str]:
    """The first ``n`` calibration texts, formatted as LACUNA QA text (``Q: q\\nA: a\\n``).

    ``source`` is a LACUNA data source (anything :func:`lacuna_tasks.loader.load_data` accepts: a data or
    testbed directory; None = bundled data), whose ``split`` rows are formatted with ``qa_text``; or a text file:
    ``.jsonl`` (field ``text``, or ``question`` + ``answer``) or ``.txt`` (one text per non-blank line, stripped of
    leading and trailing blanks as FRAG's own loader does), for which
    ``split`` is ignored. FRAG's authors use the first 128 rows (docs/definitions.md#frag-activation-statistics).

    ``fields`` (keys like ``email`` or PANORAMA columns; None = every row): only rows of those fields, the first
    ``n`` of them, so FRAG is calibrated on the field(s) a run actually unlearned (docs/scoring.md, "FRAG
    calibration fields"). A ``.jsonl`` file is filtered on its rows' ``field`` column; a ``.txt`` file has none.
    ValueError naming the field(s) and the file when the selection is empty.
    """
    from lacuna_tasks import get_field, qa_text

    if n < 1:
        raise ValueError(f"calibration_texts: n must be >= 1, got {n}")
    keys = calibration_fields(fields)
    columns = {get_field(k).column for k in keys} if keys is not None else None
    path = Path(source) if source is not None else None
    if path is not None and path.is_file():
        texts = _texts_from_file(path, n, columns)
        if not texts:
            if keys is not None:
                raise ValueError(f"calibration file {path} holds no rows of field(s) {', '.join(keys)}")
            raise ValueError(f"calibration file {path} holds no texts")
        return texts
    from lacuna_tasks import load_data

    data = load_data(source)
    if split not in data.splits:
        raise ValueError(f"{data.source}: no split {split!r} for calibration (found: {sorted(data.splits)})")
    rows = data.splits[split]
    if columns is not None:
        rows = [r for r in rows if r["field"] in columns]
        if not rows:
            assert keys is not None
            raise ValueError(
                f"{data.files.get(split, data.source)}: split {split!r} has no rows of field(s) {', '.join(keys)} "
                "for FRAG calibration"
            )
    texts = [qa_text(str(r["question"]), str(r["answer"])) for r in rows[:n]]
    if not texts:
        raise ValueError(f"{data.source}: split {split!r} is empty, no calibration texts")
    return texts


def _texts_from_file(path: Path, n: int, columns: set[str] | None = None) -> list[str]:
    from lacuna_tasks import get_field, qa_text, read_rows, reading

    suffix = path.suffix.lower()
    if suffix == ".txt":
        if columns is not None:
            raise ValueError(f"calibration file {path}: a .txt file has no field column to select fields by")
        # Each line stripped of leading and trailing blanks, blank lines skipped: FRAG's own loader
        # (predictor.py load_examples) does the same, so a blank-padded file calibrates alike.
        with reading(path), path.open(encoding="utf-8") as fh:  # unreadable or not UTF-8: one line naming it
            return [line.strip() for line in fh if line.strip()][:n]
    if suffix != ".jsonl":
        raise ValueError(f"calibration file {path}: expected a .jsonl or .txt file")
    rows = read_rows(path)
    if columns is not None:
        kept = []
        for lineno, row in enumerate(rows, 1):
            if not isinstance(row.get("field"), str):
                raise ValueError(f"{path}: row {lineno}: no string 'field' column to select calibration fields by")
            if get_field(row["field"]).column in columns:
                kept.append((lineno, row))
    else:
        kept = list(enumerate(rows, 1))
    texts: list[str] = []
    for lineno, row in kept[:n]:
        if isinstance(row.get("text"), str):
            texts.append(row["text"])
        elif isinstance(row.get("question"), str) and isinstance(row.get("answer"), str):
            texts.append(qa_text(row["question"], row["answer"]))
        else:
            raise ValueError(f"{path}: row {lineno}: expected a string field 'text', or 'question' and 'answer'")
    return texts
