"""Relations across the rows and splits of a LACUNA data directory (unique IDs, one ID = one person,
profile agreement, disjoint sides, held-out people), checked when the directory is loaded.

Each case copies the bundled data into tmp_path, corrupts one thing and expects a one-line
LacunaDataError naming the file, the split, the row and the offending ID/field. Through the real ``lm_eval`` CLI:
tests/e2e/test_data_validation_cli.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lacuna_tasks.harness.hooks import load_docs
from lacuna_tasks.loader import BUNDLED_DIR, load_data
from lacuna_tasks.schema import SPLITS, LacunaDataError

ONE_ROW_PER_PERSON = [s for s in SPLITS if s != "relearn"]


@pytest.fixture
def data_dir(tmp_path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(BUNDLED_DIR, dst)
    return dst


def read(d: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (d / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def write(d: Path, name: str, rows: list[dict]) -> None:
    (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def error_of(d: Path) -> str:
    with pytest.raises(LacunaDataError) as info:
        load_data(d)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def where(d: Path, split: str, row: int) -> str:
    return re.escape(f"{d.resolve() / f'{split}.jsonl'}: split {split!r} row {row}")


def test_bundled_data_passes(data_dir):
    bundled = load_data()  # the packaged copy
    copied = load_data(data_dir)  # the same files from a user directory
    assert copied.fingerprint == bundled.fingerprint
    assert set(copied.splits) == set(SPLITS) and len(copied.profiles) == 1200


# --------------------------------------------------------------------------- unique keys


@pytest.mark.parametrize("split", ONE_ROW_PER_PERSON)
def test_duplicate_id_in_a_split(data_dir, split):
    """Two people sharing an ID in one split and field (the issue): caught as a duplicate, not pooled."""
    rows = read(data_dir, split)
    j = next(k for k in range(1, len(rows)) if rows[k]["field"] == rows[0]["field"])
    rows[j]["ID"] = rows[0]["ID"]
    write(data_dir, split, rows)
    message = error_of(data_dir)
    assert re.match(where(data_dir, split, j) + f": duplicate ID '{rows[0]['ID']}' field '{rows[0]['field']}'", message)
    assert "(also row 0)" in message


def test_duplicate_row_in_relearn(data_dir):
    rows = read(data_dir, "relearn")
    rows.insert(3, dict(rows[1]))
    write(data_dir, "relearn", rows)
    message = error_of(data_dir)
    assert re.match(where(data_dir, "relearn", 3) + f": duplicate ID '{rows[1]['ID']}' field .* question", message)


def test_another_persons_row_under_an_id_in_relearn(data_dir):
    """relearn has several rows per person, so a borrowed ID shows up as a disagreement with the profile."""
    rows = read(data_dir, "relearn")
    j = next(k for k, r in enumerate(rows) if r["ID"] != rows[0]["ID"] and r["field"] == rows[0]["field"])
    rows[j]["ID"] = rows[0]["ID"]
    write(data_dir, "relearn", rows)
    message = error_of(data_dir)
    assert re.match(
        where(data_dir, "relearn", j) + f": ID '{rows[0]['ID']}' field '{rows[0]['field']}': answer", message
    )
    assert "disagrees with the profile's" in message and "profiles.jsonl" in message


def test_duplicate_profile_id(data_dir):
    profiles = read(data_dir, "profiles")
    profiles[7]["Unique ID"] = profiles[2]["Unique ID"]
    write(data_dir, "profiles", profiles)
    message = error_of(data_dir)
    pid = profiles[2]["Unique ID"]
    assert message.startswith(
        f"{data_dir.resolve() / 'profiles.jsonl'}: row 7: duplicate Unique ID '{pid}' (also row 2)"
    )


def test_issue_two_people_share_an_id_without_profiles(data_dir):
    """The issue's data: every row of person B relabelled with person A's ID, no profiles table."""
    (data_dir / "profiles.jsonl").unlink()
    forget = read(data_dir, "forget")
    a, b = forget[0]["ID"], next(r["ID"] for r in forget if r["ID"] != forget[0]["ID"])
    for split in SPLITS:
        write(data_dir, split, [{**r, "ID": a if r["ID"] == b else r["ID"]} for r in read(data_dir, split)])
    message = error_of(data_dir)
    prefix = re.escape(f"{data_dir.resolve() / 'forget.jsonl'}: split 'forget' row ")
    assert re.match(prefix + rf"\d+: duplicate ID '{a}' field '[^']+' \(also row \d+\)", message)


# --------------------------------------------------------------------------- person <-> profile


@pytest.mark.parametrize("split", SPLITS)
def test_id_without_profile(data_dir, split):
    rows = read(data_dir, split)
    rows[4]["ID"] = "no-such-person"
    write(data_dir, split, rows)
    message = error_of(data_dir)
    assert re.match(where(data_dir, split, 4) + ": ID 'no-such-person' has no profile in .*profiles\\.jsonl$", message)


@pytest.mark.parametrize("split", SPLITS)
def test_answer_disagrees_with_profile(data_dir, split):
    rows = read(data_dir, split)
    rows[2]["answer"] = "someone.else@example.com"
    write(data_dir, split, rows)
    message = error_of(data_dir)
    pattern = f": ID '{rows[2]['ID']}' field '{rows[2]['field']}': answer 'someone.else@example.com' disagrees"
    assert re.match(where(data_dir, split, 2) + re.escape(pattern), message)


def test_question_about_another_person(data_dir):
    """The extraction/paraphrase probes take the name from the profile: the question must be about it."""
    rows = read(data_dir, "forget")
    name = rows[1]["question"].split(",", 1)[0]
    rows[1]["question"] = "Zebedee Quux," + rows[1]["question"].split(",", 1)[1]
    write(data_dir, "forget", rows)
    message = error_of(data_dir)
    assert re.match(where(data_dir, "forget", 1) + f": ID '{rows[1]['ID']}': the question does not name", message)
    assert repr(name) in message


def test_group_disagrees_with_profile(data_dir):
    rows = read(data_dir, "forget")
    rows[0]["group_id"] = 2 if rows[0]["group_id"] != 2 else 4
    write(data_dir, "forget", rows)
    message = error_of(data_dir)
    assert re.match(
        where(data_dir, "forget", 0) + f": ID '{rows[0]['ID']}' has group_id {rows[0]['group_id']} but", message
    )


def test_qa_tuning_person_in_a_split(data_dir):
    profiles = read(data_dir, "profiles")
    person = read(data_dir, "retain")[0]["ID"]
    for p in profiles:
        if p["Unique ID"] == person:
            p["role"] = "qa_tuning"
    write(data_dir, "profiles", profiles)
    message = error_of(data_dir)
    assert re.match(where(data_dir, "retain", 0) + f": ID '{person}' is a held-out QA-tuning person", message)


# --------------------------------------------------------------------------- one ID, one person (no profiles)


def test_two_names_under_one_id(data_dir):
    (data_dir / "profiles.jsonl").unlink()
    rows = read(data_dir, "forget")
    a = rows[0]
    # A row of another person of the same group, in a field where A has no forget row, relabelled as A.
    a_fields = {r["field"] for r in rows if r["ID"] == a["ID"]}
    donors = [r for r in read(data_dir, "relearn") if r["group_id"] == a["group_id"] and r["field"] not in a_fields]
    if not donors:  # A has every field in forget: free one up
        rows = [r for r in rows if not (r["ID"] == a["ID"] and r["field"] == "Phone Number")]
        donors = [
            r for r in read(data_dir, "relearn") if r["group_id"] == a["group_id"] and r["field"] == "Phone Number"
        ]
    rows.append({**donors[0], "ID": a["ID"]})
    write(data_dir, "forget", rows)
    message = error_of(data_dir)
    other = donors[0]["question"].split(",", 1)[0]
    assert re.match(where(data_dir, "forget", len(rows) - 1) + f": ID '{a['ID']}' names '{other}' but", message)
    assert "forget.jsonl: split 'forget' row 0 names" in message


def test_two_groups_under_one_id(data_dir):
    (data_dir / "profiles.jsonl").unlink()
    rows = read(data_dir, "forget_paraphrased")
    rows[0]["group_id"] = 2 if rows[0]["group_id"] != 2 else 4
    write(data_dir, "forget_paraphrased", rows)
    message = error_of(data_dir)
    assert re.match(where(data_dir, "forget_paraphrased", 0) + f": ID '{rows[0]['ID']}' has group_id", message)
    assert "forget.jsonl: split 'forget' row" in message


def test_two_answers_for_one_person_and_field(data_dir):
    (data_dir / "profiles.jsonl").unlink()
    rows = read(data_dir, "retain_paraphrased")
    rows[3]["answer"] = "other@example.com"
    write(data_dir, "retain_paraphrased", rows)
    message = error_of(data_dir)
    pattern = f": ID '{rows[3]['ID']}' field '{rows[3]['field']}' has answer 'other@example.com' but "
    assert re.match(where(data_dir, "retain_paraphrased", 3) + re.escape(pattern), message)


# --------------------------------------------------------------------------- disjoint sides and held-out people


@pytest.mark.parametrize("target", ["retain", "retain_paraphrased"])
def test_person_in_forget_and_retain(data_dir, target):
    person = read(data_dir, "forget")[0]
    rows = read(data_dir, target)
    rows.append(person)
    write(data_dir, target, rows)
    message = error_of(data_dir)
    assert re.match(
        where(data_dir, target, len(rows) - 1) + f": ID '{person['ID']}' .* is also on the forget side", message
    )
    assert "forget.jsonl: split 'forget' row 0" in message


def test_group_in_forget_and_retain(data_dir):
    (data_dir / "profiles.jsonl").unlink()
    forget_group = read(data_dir, "forget")[0]["group_id"]
    retain = read(data_dir, "retain")
    person = retain[0]["ID"]
    for split in SPLITS:  # move one retain person, consistently, into a forget group
        write(
            data_dir,
            split,
            [{**r, "group_id": forget_group} if r["ID"] == person else r for r in read(data_dir, split)],
        )
    message = error_of(data_dir)
    assert re.match(
        where(data_dir, "retain", 0) + f": ID '{person}' has group_id {forget_group}, a forget-side group", message
    )


@pytest.mark.parametrize(
    ("split", "source"), [("validation", "forget"), ("relearn", "retain"), ("relearn", "validation")]
)
def test_held_out_people_outside_other_splits(data_dir, split, source):
    person = read(data_dir, source)[0]
    rows = read(data_dir, split)
    rows.append(person)
    write(data_dir, split, rows)
    message = error_of(data_dir)
    assert re.match(
        where(data_dir, split, len(rows) - 1) + f": ID '{person['ID']}' is also in split '{source}'", message
    )


# --------------------------------------------------------------------------- other layouts and the task entry point


def test_save_to_disk_datasetdict_layout_is_validated(tmp_path):
    import datasets

    bundled = load_data()
    splits = {s: list(bundled.splits[s]) for s in ("forget", "retain")}
    splits["retain"][5] = {**splits["retain"][5], "ID": splits["retain"][0]["ID"]}
    splits["retain"][5]["field"] = splits["retain"][0]["field"]
    disk = tmp_path / "saved"
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in splits.items()}).save_to_disk(str(disk))
    message = error_of(disk)
    assert message.startswith(f"{disk.resolve() / 'retain'}: split 'retain' row 5: duplicate ID")


def test_task_entry_point_fails_before_building_docs(data_dir):
    rows = read(data_dir, "forget")
    rows[1]["ID"] = rows[0]["ID"]
    write(data_dir, "forget", rows)
    with pytest.raises(LacunaDataError, match=r"split 'forget' row 1: duplicate ID"):
        load_docs(field="email", side="forget", kind="extraction", lacuna_data=str(data_dir))
