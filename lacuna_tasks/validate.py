"""Relations between the rows and splits of a LACUNA data directory, checked when it is loaded.

:func:`lacuna_tasks.schema.validate_rows` checks each QA row on its own. This module checks what the
rows say about each other: the relations :func:`lacuna_tasks.synth.splits.build_splits` creates and the
released LACUNA datasets follow (the split invariants are also pinned by ``tests/tasks/synth/test_generate.py``):

* keys: ``profiles`` has one row per ``Unique ID``; ``forget``, ``retain``, ``forget_paraphrased``,
  ``retain_paraphrased``, ``retain_eval``, ``retain_eval_paraphrased`` and ``validation`` have one row
  per (ID, field); ``relearn`` (several memorized questions per person) one row per (ID, field, question);
* one ID is one person in every split: the same name (the ``"First Last, ..."`` prefix of the
  question), the same ``group_id``, and per field the same answer;
* with a profiles table: every ID has a profile, the question names that profile's person, the
  answer equals the profile's value for the field, ``group_id`` equals the profile's, and no row is
  about a held-out QA-tuning person (``role == "qa_tuning"``);
* sides: a person's group decides whether it is forgotten or retained, so a person (and a group) is
  either on the forget side (``forget``, ``forget_paraphrased``) or on the retain side (``retain``,
  ``retain_paraphrased``, ``retain_eval``, ``retain_eval_paraphrased``), never on both;
* held-out people: ``retain_eval`` people (optional splits, held out from every unlearning input; see
  ``docs/tasks.md``) are in no main split; ``validation`` people are in no main and no retain-eval
  split; ``relearn`` people are in no main, retain-eval or validation split.

A duplicated ID would otherwise evaluate silently: per-person aggregates would pool two people and
the probes would ask about one person while checking for the other's fact. Every violation raises a
one-line :class:`~lacuna_tasks.schema.LacunaDataError` naming the file, split, row and ID/field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lacuna_tasks.prompts import full_name
from lacuna_tasks.schema import ROLE_QA_TUNING, LacunaDataError

ID_COLUMN = "Unique ID"  #: the profiles table's person ID (PANORAMA's column name)

#: Splits with several rows per (person, field) and the columns that key one row.
MULTI_ROW_KEYS: dict[str, tuple[str, ...]] = {"relearn": ("ID", "field", "question")}
PERSON_FIELD_KEY: tuple[str, ...] = ("ID", "field")

#: Optional held-out retain-side splits (``build_splits(retain_eval_people=N)``): people memorized like the retain
#: people but in no unlearning input, so retain accuracy measured on them can fail. Absent from older data.
RETAIN_EVAL_SPLITS: tuple[str, ...] = ("retain_eval", "retain_eval_paraphrased")
#: The main splits: what unlearning trains on (forget / retain rows) and their paraphrased twins.
MAIN_SPLITS: tuple[str, ...] = ("forget", "forget_paraphrased", "retain", "retain_paraphrased")
#: The forget side and the retain side: a person (and its group) belongs to exactly one.
SIDE_SPLITS: dict[str, tuple[str, ...]] = {
    "forget": ("forget", "forget_paraphrased"),
    "retain": ("retain", "retain_paraphrased", *RETAIN_EVAL_SPLITS),
}
#: Splits whose people must not appear in the listed splits (together: disjoint by person, pairwise).
HELD_OUT: dict[str, tuple[str, ...]] = {
    **{split: MAIN_SPLITS for split in RETAIN_EVAL_SPLITS},
    "validation": (*MAIN_SPLITS, *RETAIN_EVAL_SPLITS),
    "relearn": (*MAIN_SPLITS, *RETAIN_EVAL_SPLITS, "validation"),
}


def index_profiles(rows: Iterable[Mapping[str, Any]], source: str) -> dict[str, dict[str, Any]]:
    """Profiles by ``Unique ID``; a missing or duplicated ID raises LacunaDataError naming the row."""
    profiles: dict[str, dict[str, Any]] = {}
    first_row: dict[str, int] = {}
    for i, row in enumerate(rows):
        if ID_COLUMN not in row:
            raise LacunaDataError(f"{source}: row {i} lacks column {ID_COLUMN!r}")
        pid = str(row[ID_COLUMN])
        if pid in profiles:
            raise LacunaDataError(
                f"{source}: row {i}: duplicate {ID_COLUMN} {pid!r} (also row {first_row[pid]}); "
                "each person has one profile"
            )
        profiles[pid] = dict(row)
        first_row[pid] = i
    return profiles


def validate_dataset(
    splits: Mapping[str, list[dict[str, Any]]],
    files: Mapping[str, str],
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    profiles_source: str = "profiles",
    *,
    parts: Mapping[str, Sequence[tuple[str, int]]] | None = None,
) -> None:
    """Check the relations above across all splits (rows already checked by ``validate_rows``).

    ``parts``: for a split read from several files (LACUNA's release: one parquet file per field), its files in
    order with their row counts, so that a message names the file holding the row and the row's index in it."""
    order = [s for s in (*MAIN_SPLITS, *RETAIN_EVAL_SPLITS, "validation", "relearn") if s in splits]
    order += [s for s in splits if s not in order]

    def at(split: str, i: int, *, short: bool = False) -> str:
        file = files.get(split, split)
        for part, count in (parts or {}).get(split, ()):
            if i < count:
                file = part
                break
            i -= count
        return f"{Path(file).name if short else file}: split {split!r} row {i}"

    # 1. Keys unique within each split.
    for split in order:
        key_columns = MULTI_ROW_KEYS.get(split, PERSON_FIELD_KEY)
        seen: dict[tuple, int] = {}
        for i, row in enumerate(splits[split]):
            key = tuple(row[c] for c in key_columns)
            if key in seen:
                what = f"ID {row['ID']!r} field {row['field']!r}"
                if key_columns == PERSON_FIELD_KEY:
                    rule = "one row per person and field in this split"
                else:
                    what += " question"
                    rule = "one row per person, field and question in this split"
                raise LacunaDataError(f"{at(split, i)}: duplicate {what} (also row {seen[key]}); {rule}")
            seen[key] = i

    # 2. Each row against its person's profile.
    if profiles is not None:
        for split in order:
            for i, row in enumerate(splits[split]):
                _check_against_profile(row, profiles, profiles_source, at(split, i))

    # 3. One ID, one person: name, group and answers agree across every row of every split.
    first: dict[str, tuple[str, int]] = {}  # ID -> (split, row) of its first row
    names: dict[str, tuple[str, str, int]] = {}  # ID -> (name, split, row)
    answers: dict[tuple[str, str], tuple[str, str, int]] = {}  # (ID, field) -> (answer, split, row)
    for split in order:
        for i, row in enumerate(splits[split]):
            pid, fld = row["ID"], row["field"]
            if pid not in first:
                first[pid] = (split, i)
            else:
                s0, i0 = first[pid]
                other = splits[s0][i0]
                if other["group_id"] != row["group_id"]:
                    raise LacunaDataError(
                        f"{at(split, i)}: ID {pid!r} has group_id {row['group_id']} but {at(s0, i0, short=True)} "
                        f"gives the same ID group_id {other['group_id']}; one ID must be one person"
                    )
            name = _question_name(row["question"]) if profiles is None else None
            if name is not None:
                if pid in names and names[pid][0] != name:
                    name0, s0, i0 = names[pid]
                    raise LacunaDataError(
                        f"{at(split, i)}: ID {pid!r} names {name!r} but {at(s0, i0, short=True)} names {name0!r} "
                        "for the same ID; one ID must be one person"
                    )
                names.setdefault(pid, (name, split, i))
            answer = row["answer"].strip()
            if (pid, fld) in answers and answers[(pid, fld)][0] != answer:
                answer0, s0, i0 = answers[(pid, fld)]
                raise LacunaDataError(
                    f"{at(split, i)}: ID {pid!r} field {fld!r} has answer {answer!r} but {at(s0, i0, short=True)} "
                    f"has {answer0!r} for the same person and field"
                )
            answers.setdefault((pid, fld), (answer, split, i))

    # 4. A person, and a group, is on the forget side or on the retain side, not both.
    side_people: dict[str, tuple[str, int]] = {}
    side_groups: dict[int, tuple[str, int]] = {}
    for split in SIDE_SPLITS["forget"]:
        for i, row in enumerate(splits.get(split, ())):
            side_people.setdefault(row["ID"], (split, i))
            side_groups.setdefault(row["group_id"], (split, i))
    retain_rows = [(s, i, r) for s in SIDE_SPLITS["retain"] for i, r in enumerate(splits.get(s, ()))]
    for split, i, row in retain_rows:
        if row["ID"] in side_people:
            s0, i0 = side_people[row["ID"]]
            raise LacunaDataError(
                f"{at(split, i)}: ID {row['ID']!r} (field {row['field']!r}) is also on the forget side "
                f"({at(s0, i0, short=True)}); forget and retain people must be disjoint"
            )
    for split, i, row in retain_rows:
        if row["group_id"] in side_groups:
            s0, i0 = side_groups[row["group_id"]]
            raise LacunaDataError(
                f"{at(split, i)}: ID {row['ID']!r} has group_id {row['group_id']}, a forget-side group "
                f"({at(s0, i0, short=True)}); forget and retain groups must be disjoint"
            )

    # 5. Held-out people: retain-eval outside the main splits, validation outside main and retain-eval, relearn
    #    outside all of them.
    for split, excluded in HELD_OUT.items():
        if split not in splits:
            continue
        used: dict[str, tuple[str, int]] = {}
        for other in excluded:
            for i, row in enumerate(splits.get(other, ())):
                used.setdefault(row["ID"], (other, i))
        for i, row in enumerate(splits[split]):
            if row["ID"] in used:
                s0, i0 = used[row["ID"]]
                raise LacunaDataError(
                    f"{at(split, i)}: ID {row['ID']!r} is also in split {s0!r} ({at(s0, i0, short=True)}); "
                    f"{split} people must be in none of {list(excluded)}"
                )


def _check_against_profile(
    row: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]], profiles_source: str, where: str
) -> None:
    pid, fld = row["ID"], row["field"]
    profile = profiles.get(pid)
    if profile is None:
        raise LacunaDataError(f"{where}: ID {pid!r} has no profile in {profiles_source}")
    if profile.get("role") == ROLE_QA_TUNING:
        raise LacunaDataError(
            f"{where}: ID {pid!r} is a held-out QA-tuning person (role {ROLE_QA_TUNING!r} in {profiles_source}); "
            "such people belong to no split"
        )
    if fld not in profile:
        raise LacunaDataError(f"{where}: ID {pid!r}: the profile has no column {fld!r} ({profiles_source})")
    expected = "" if profile[fld] is None else str(profile[fld]).strip()
    if row["answer"].strip() != expected:
        raise LacunaDataError(
            f"{where}: ID {pid!r} field {fld!r}: answer {row['answer']!r} disagrees with the profile's "
            f"{profile[fld]!r} ({profiles_source})"
        )
    missing = [c for c in ("First Name", "Last Name") if c not in profile]
    if missing:
        raise LacunaDataError(f"{where}: ID {pid!r}: the profile lacks column(s) {missing} ({profiles_source})")
    name = full_name(profile)
    if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", row["question"]):
        raise LacunaDataError(
            f"{where}: ID {pid!r}: the question does not name the profile's person {name!r} ({profiles_source})"
        )
    if profile.get("group_id") is not None and _as_int(profile["group_id"]) != row["group_id"]:
        raise LacunaDataError(
            f"{where}: ID {pid!r} has group_id {row['group_id']} but its profile has group_id "
            f"{profile['group_id']!r} ({profiles_source})"
        )


def _question_name(question: str) -> str | None:
    """The person named before the first comma of a LACUNA question, or None if there is none."""
    name = question.split(",", 1)[0].strip()
    return name if "," in question and name else None


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def check_group_ids(
    splits: Mapping[str, Sequence[Mapping[str, Any]]], files: Mapping[str, str], num_groups: int, masks: str
) -> None:
    """Every row's ``group_id`` names a group of the masks (bits ``0 .. num_groups - 1``); LacunaDataError naming the
    file, split, row, person and the mask file otherwise. A group beyond the masks' bits has no parameters: a method
    restricted to its people's masks would train nothing, and the ground truth would not cover them."""
    for split, rows in splits.items():
        for i, row in enumerate(rows):
            group = row["group_id"]
            if not 0 <= group < num_groups:
                raise LacunaDataError(
                    f"{files.get(split, split)}: split {split!r} row {i} (person {row['ID']}): group_id {group} is "
                    f"outside the {num_groups} groups of {masks} (bits 0..{num_groups - 1})"
                )
