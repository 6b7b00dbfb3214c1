"""The LACUNA data contract: fields, splits, columns, and validation of QA rows.

Everything that reads or writes LACUNA-style data goes through these names, so the
generator, the testbed builder, the lm-eval tasks and the trainer agree on one schema
(the released LACUNA schema, ``docs/definitions.md#memorization-test-and-splits``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Columns of every QA row, as in the released LACUNA datasets.
QA_COLUMNS: tuple[str, ...] = ("ID", "question", "answer", "field", "group_id")

#: Split names of a LACUNA data directory.
#: Held-out neutral prose a testbed keeps in ``data/`` (never trained on) and the lm-eval task that reads it
#: (lacuna_tasks.harness.perplexity, docs/tasks.md).
NEUTRAL_HELDOUT_FILE = "neutral_heldout.jsonl"
NEUTRAL_PPL_TASK = "lacuna_neutral_ppl"

SPLITS: tuple[str, ...] = (
    "forget",
    "retain",
    "forget_paraphrased",
    "retain_paraphrased",
    "relearn",
    "validation",
)

#: Groups whose people are forgotten / retained (LACUNA: balanced greedy gives {0,2,4} / {1,3,5}).
FORGET_GROUPS: tuple[int, ...] = (0, 2, 4)
RETAIN_GROUPS: tuple[int, ...] = (1, 3, 5)
NUM_GROUPS: int = 6


@dataclass(frozen=True)
class Field:
    """One target PII field: short key used in task names, PANORAMA column, question noun."""

    key: str
    column: str
    noun: str  # lower-case noun used in paraphrase templates ("email address")
    digits_match: bool  # also compare digits only (phone numbers, licence numbers)

    @property
    def config(self) -> str:
        """LACUNA's config name of the field (``Email_Address``, ``Drivers_License``): the PANORAMA column without
        the apostrophe, spaces as underscores, as the release names its data configs and output directories."""
        return self.column.replace("'", "").replace(" ", "_")


FIELDS: dict[str, Field] = {
    "email": Field("email", "Email Address", "email address", False),
    "phone": Field("phone", "Phone Number", "phone number", True),
    "birth_city": Field("birth_city", "Birth City", "birth city", False),
    "drivers_license": Field("drivers_license", "Driver's License", "driver's license number", True),
}

_BY_COLUMN: dict[str, Field] = {f.column: f for f in FIELDS.values()}

#: Profile values that mean "this person has no such fact" (PANORAMA writes N/A, an empty dict, None or nothing).
MISSING_VALUES: frozenset[str] = frozenset({"N/A", "{}", "None", ""})

#: A profile's ``role``: ``target`` people are the ones splits are built from; ``qa_tuning`` people are held
#: out for instruction tuning and in no split (docs/definitions.md#qa-tuning).
ROLE_TARGET = "target"
ROLE_QA_TUNING = "qa_tuning"


class LacunaDataError(ValueError):
    """Bad LACUNA data: the message names the file, split, row and column at fault."""


def get_field(name: str) -> Field:
    """Resolve a field by short key (``email``) or PANORAMA column (``Email Address``)."""
    if name in FIELDS:
        return FIELDS[name]
    if name in _BY_COLUMN:
        return _BY_COLUMN[name]
    known = ", ".join(sorted(FIELDS)) + "; or " + ", ".join(repr(c) for c in _BY_COLUMN)
    raise LacunaDataError(f"unknown field {name!r}; known fields: {known}")


def validate_rows(rows: Iterable[Mapping[str, Any]], *, source: str, split: str) -> list[dict[str, Any]]:
    """Check QA rows against the schema and return them as plain dicts.

    Fails on the first problem with a message naming ``source``, the split, the row index and
    the column, instead of letting a bad row turn into a silent score of 0.
    """
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        missing = [c for c in QA_COLUMNS if c not in row]
        if missing:
            raise LacunaDataError(
                f"{source}: split {split!r} row {i} lacks column(s) {missing}; required columns are {list(QA_COLUMNS)}"
            )
        for col in ("question", "answer", "field"):
            value = row[col]
            if not isinstance(value, str):
                raise LacunaDataError(
                    f"{source}: split {split!r} row {i} column {col!r} must be a string, got {type(value).__name__} ({value!r})"
                )
            if not value.strip():
                raise LacunaDataError(f"{source}: split {split!r} row {i} column {col!r} is empty")
        get_field(row["field"])  # unknown field names fail here
        try:
            group = int(row["group_id"])
        except (TypeError, ValueError):
            raise LacunaDataError(
                f"{source}: split {split!r} row {i} column 'group_id' must be an integer, got {row['group_id']!r}"
            ) from None
        clean = dict(row)
        clean["ID"] = str(row["ID"])
        clean["group_id"] = group
        out.append(clean)
    return out
