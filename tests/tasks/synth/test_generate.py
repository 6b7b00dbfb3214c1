"""Synthetic PANORAMA profiles, LACUNA split construction and dataset writing (lacuna_tasks.synth.profiles, .bios, .splits
and the lacuna_tasks.synth.generate entry)."""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import json
import os
import random
import re
import uuid
from pathlib import Path

import pytest

import lacuna_tasks
from lacuna_tasks.loader import fingerprint as loader_fingerprint
from lacuna_tasks.loader import load_data
from lacuna_tasks.prompts import full_name
from lacuna_tasks.schema import FIELDS, FORGET_GROUPS, QA_COLUMNS, RETAIN_GROUPS, SPLITS, get_field, validate_rows
from lacuna_tasks.synth import profiles as prof
from lacuna_tasks.synth import splits as spl
from lacuna_tasks.synth.bios import bio_texts
from lacuna_tasks.synth.generate import generate_dataset
from lacuna_tasks.synth.profiles import LOCALES, PROFILE_COLUMNS, faker_version, generate_profiles
from lacuna_tasks.synth.splits import build_splits, write_dataset

BUNDLED = Path(lacuna_tasks.__file__).parent / "data" / "default"
EMAIL_RE = re.compile(r"^[a-z0-9][a-z0-9._]*@[a-z0-9-]+(\.[a-z0-9-]+)+$")
DL_RE = re.compile(r"^[A-Z]{2}-DL-\d{7,12}$")
MAIN_SPLITS = ("forget", "retain", "forget_paraphrased", "retain_paraphrased")


@pytest.fixture(scope="module")
def profiles() -> list[dict]:
    return generate_profiles(60, seed=3)


@pytest.fixture(scope="module")
def splits(profiles) -> dict[str, list[dict]]:
    return build_splits(profiles, seed=3)


def digits(s: str) -> str:
    return re.sub(r"\D", "", s)


def people(rows, field: str | None = None) -> set[str]:
    return {r["ID"] for r in rows if field is None or r["field"] == field}


# --------------------------------------------------------------------------------------------- profiles


def test_profiles_are_deterministic_per_seed(profiles, splits):
    assert generate_profiles(60, seed=3) == profiles
    assert build_splits(generate_profiles(60, seed=3), seed=3) == splits
    other = generate_profiles(60, seed=4)
    assert other != profiles
    assert {p["Unique ID"] for p in other}.isdisjoint(p["Unique ID"] for p in profiles)
    assert build_splits(profiles, seed=4) != splits  # the split seed alone changes people and questions


def test_columns_are_panorama_plus_group_and_role(profiles):
    assert len(PROFILE_COLUMNS) == 37 and PROFILE_COLUMNS[-2:] == ("group_id", "role")
    assert PROFILE_COLUMNS[:3] == ("Unique ID", "Locale", "First Name")
    assert PROFILE_COLUMNS[34] == "Emergency Contact Phone"
    for p in profiles:
        assert tuple(p) == PROFILE_COLUMNS
    assert {p["Locale"] for p in profiles} == set(LOCALES)


def test_field_formats(profiles):
    for p in profiles:
        cc = prof.COUNTRY_CODES[p["Locale"]]
        assert uuid.UUID(p["Unique ID"]).version == 4
        assert p["Gender"] in ("Male", "Female", "Non-Binary", "Other")
        assert 18 <= p["Age"] <= 90
        born = dt.date.fromisoformat(p["Birth Date"])
        ref = prof.REFERENCE_DATE
        assert ref.year - born.year - ((ref.month, ref.day) < (born.month, born.day)) == p["Age"]
        email = p["Email Address"]
        assert EMAIL_RE.match(email) and email == email.lower(), email
        assert email.split("@")[1] in prof.EMAIL_DOMAINS[p["Locale"]]
        dl = p["Driver's License"]
        assert dl == "N/A" or (DL_RE.match(dl) and dl.startswith(f"{cc}-DL-")), dl
        phone = p["Phone Number"]
        assert len(digits(phone)) >= 7 and not re.search(r"x|ext", phone, re.I), phone
        assert p["Birth City"].strip()
        if p["Locale"] == "en_US":
            assert re.match(r"^\d{3}-\d{2}-\d{4}$", p["National ID"])
        else:
            assert re.match(rf"^{cc}-ID-\d{{7}}$", p["National ID"])
        assert isinstance(ast.literal_eval(p["Social Media Handles"]), dict)
        for value in p.values():
            assert value is not None and str(value).strip()


def test_group_balance_and_roles(profiles):
    per_group = [sum(p["group_id"] == g for p in profiles) for g in range(6)]
    assert per_group == [10] * 6
    tuning = [p for p in profiles if p["role"] == "qa_tuning"]
    assert len(tuning) == round(0.125 * 60)
    tuning_per_group = [sum(p["group_id"] == g for p in tuning) for g in range(6)]
    assert max(tuning_per_group) - min(tuning_per_group) <= 1
    assert {p["role"] for p in profiles} == {"target", "qa_tuning"}


def test_too_few_profiles_rejected():
    with pytest.raises(ValueError, match=">= 12"):
        generate_profiles(11)


def test_full_scale_uniqueness_and_bundled_reproduction():
    full = generate_profiles(1200, seed=42)
    for column in ("Email Address", "Phone Number", "Unique ID"):
        values = [p[column] for p in full]
        assert len(set(values)) == len(values), column
    names = [full_name(p) for p in full]
    assert len(set(names)) == len(names)
    licences = [p["Driver's License"] for p in full if p["Driver's License"] != "N/A"]
    assert len(set(licences)) == len(licences) and 0.8 < len(licences) / 1200 < 0.9
    for numbers in ([digits(p["Phone Number"]) for p in full], [digits(x) for x in licences]):
        assert len(set(numbers)) == len(numbers)  # digits-only matching must still tell people apart
    assert [sum(p["group_id"] == g for p in full) for g in range(6)] == [200] * 6
    tuning = [p for p in full if p["role"] == "qa_tuning"]
    assert [sum(p["group_id"] == g for p in tuning) for g in range(6)] == [25] * 6

    manifest = json.loads((BUNDLED / "manifest.json").read_text(encoding="utf-8"))
    if manifest["faker_version"] != faker_version():
        pytest.skip(f"bundled data made with Faker {manifest['faker_version']}, installed {faker_version()}")
    splits = build_splits(full, seed=42, people_per_field=100, validation_people=100)
    assert load_data(BUNDLED).fingerprint == manifest["fingerprint"]
    assert loader_fingerprint({s: splits[s] for s in SPLITS}) == manifest["fingerprint"]


# --------------------------------------------------------------------------------------------- bios


def test_bio_texts_contain_all_target_facts(profiles):
    with_dl = next(p for p in profiles if p["Driver's License"] != "N/A")
    without_dl = next(p for p in profiles if p["Driver's License"] == "N/A")
    texts = bio_texts(with_dl, random.Random(0), 12)
    assert len(texts) == 12 and len(set(texts)) >= 6
    assert texts == bio_texts(with_dl, random.Random(0), 12)
    for text in texts:
        for column in ("Email Address", "Phone Number", "Birth City", "Driver's License"):
            assert with_dl[column] in text, (column, text)
        assert full_name(with_dl) in text
    # All six content types appear in the first six texts (one template family each).
    openings = {t.split(" ")[0] for t in texts[:6]}
    assert len(openings) == 6
    for text in bio_texts(without_dl, random.Random(1), 6):
        assert full_name(without_dl) in text and without_dl["Email Address"] in text and "N/A" not in text


# --------------------------------------------------------------------------------------------- splits


def test_split_invariants(profiles, splits):
    assert set(splits) == set(SPLITS)
    by_id = {p["Unique ID"]: p for p in profiles}
    for split, rows in splits.items():
        assert rows, split
        validate_rows(rows, source="test", split=split)
        for r in rows:
            assert tuple(r) == QA_COLUMNS
            p = by_id[r["ID"]]
            assert p["role"] == "target" and r["group_id"] == p["group_id"]
            column = r["field"]
            assert r["answer"] == p[column] and r["answer"] != "N/A"
            assert r["question"].startswith(full_name(p) + ", ") and r["question"].endswith(f" {column}?")
            assert not r["question"].startswith("Q:")
    for side, groups in (("forget", FORGET_GROUPS), ("retain", RETAIN_GROUPS)):
        for split in (side, f"{side}_paraphrased"):
            assert {r["group_id"] for r in splits[split]} <= set(groups)
        main = {(r["ID"], r["field"]): r["question"] for r in splits[side]}
        para = {(r["ID"], r["field"]): r["question"] for r in splits[f"{side}_paraphrased"]}
        assert main.keys() == para.keys() and len(main) == len(splits[side])
        assert all(main[k] != para[k] for k in main)
    for field in FIELDS.values():
        n_forget = len(people(splits["forget"], field.column))
        assert n_forget == len(people(splits["retain"], field.column)) > 0
    main_people = people(row for s in MAIN_SPLITS for row in splits[s])
    val = splits["validation"]
    assert {r["field"] for r in val} == {"Email Address", "Driver's License"}
    assert people(val).isdisjoint(main_people)
    for column in ("Email Address", "Driver's License"):
        rows = [r for r in val if r["field"] == column]
        assert sum(r["group_id"] in FORGET_GROUPS for r in rows) == sum(r["group_id"] in RETAIN_GROUPS for r in rows)
    assert people(splits["relearn"]).isdisjoint(main_people | people(val))
    pairs = [(r["ID"], r["question"]) for r in splits["relearn"]]
    assert len(pairs) == len(set(pairs))
    # Main people recur across fields (people eligible for all four are preferred).
    assert people(splits["forget"], "Email Address") & people(splits["forget"], "Phone Number")


def test_split_sizes_are_per_side(profiles):
    s = build_splits(profiles, seed=3, people_per_field=5, validation_people=2)
    for field in FIELDS.values():
        for split in MAIN_SPLITS:
            assert len(people(s[split], field.column)) == 5
    assert len(s["validation"]) == 2 * 2 * 2  # 2 fields x 2 sides x 2 people, one question each
    with pytest.raises(ValueError, match="people_per_field=40"):
        build_splits(profiles, seed=3, people_per_field=40)
    with pytest.raises(ValueError, match="validation_people=30"):
        build_splits(profiles, seed=3, people_per_field=5, validation_people=30)


def memorized_from(profiles, seed: int = 0) -> dict[tuple[str, str], list[str]]:
    """Every target person 'memorized' 3 generated questions per non-N/A field."""
    out = {}
    for p in profiles:
        for key, field in FIELDS.items():
            if p["role"] == "target" and p[field.column] != "N/A":
                out[(p["Unique ID"], key)] = spl._distinct_questions(p, key, seed, 3)
    return out


def test_memorized_eligibility_needs_two_distinct_questions(profiles):
    memorized = memorized_from(profiles)
    targets = [p["Unique ID"] for p in profiles if p["role"] == "target"]
    one, duplicated = targets[0], targets[1]
    memorized[(one, "email")] = memorized[(one, "email")][:1]
    q = memorized[(duplicated, "email")][0]
    memorized[(duplicated, "email")] = [q, q]
    qa_person = next(p["Unique ID"] for p in profiles if p["role"] == "qa_tuning")
    memorized[(qa_person, "email")] = ["a question", "another question"]  # held out: ignored

    # Generous sizes so that every eligible person would be picked somewhere if allowed.
    s = build_splits(profiles, seed=3, people_per_field=8, validation_people=3, memorized=memorized)
    email_rows = [r for split in (*MAIN_SPLITS, "validation") for r in s[split] if r["field"] == "Email Address"]
    assert {one, duplicated, qa_person}.isdisjoint(people(email_rows))
    assert qa_person not in people(r for rows in s.values() for r in rows)
    for split in (*MAIN_SPLITS, "validation", "relearn"):
        for r in s[split]:
            assert r["question"] in memorized[(r["ID"], get_field(r["field"]).key)]
    assert build_splits(profiles, seed=3, people_per_field=8, validation_people=3, memorized=memorized) == s

    with pytest.raises(ValueError, match="unknown person ID"):
        build_splits(profiles, memorized={("no-such-id", "email"): ["q1", "q2"]})


def test_empty_split_is_an_error(profiles):
    memorized = {k: v for k, v in memorized_from(profiles).items() if k[1] != "birth_city"}
    with pytest.raises(ValueError, match=r"'Birth City'.*'forget'"):
        build_splits(profiles, memorized=memorized)
    with_dl = [p for p in profiles if p["role"] == "target" and p["Driver's License"] != "N/A"]
    fewest = min(sum(p["group_id"] in groups for p in with_dl) for groups in (FORGET_GROUPS, RETAIN_GROUPS))
    with pytest.raises(ValueError, match=r"\"Driver's License\".*'validation' would be empty"):
        build_splits(profiles, people_per_field=fewest)  # every licence holder of one side is in a main split
    # Two licence holders per side memorized everything: one for the main splits, one for validation.
    chosen = [p["Unique ID"] for groups in (FORGET_GROUPS, RETAIN_GROUPS) for p in with_dl if p["group_id"] in groups]
    chosen = chosen[:2] + chosen[-2:]
    few = {k: v for k, v in memorized_from(profiles).items() if k[0] in chosen}
    with pytest.raises(ValueError, match="'relearn' would be empty"):
        build_splits(profiles, people_per_field=1, validation_people=1, memorized=few)


# --------------------------------------------------------------------------------------------- writing


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_write_dataset_files_and_manifest(tmp_path, profiles, splits):
    out = write_dataset(tmp_path / "ds", profiles, splits, manifest={"seed": 3})
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["profiles.jsonl", "manifest.json", *(f"{s}.jsonl" for s in SPLITS)])
    for split in SPLITS:
        rows = read_jsonl(out / f"{split}.jsonl")
        assert rows == splits[split] and all(tuple(r) == QA_COLUMNS for r in rows)
    assert read_jsonl(out / "profiles.jsonl") == profiles
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["seed"] == 3 and manifest["generator"] == "lacuna_tasks.generate"
    assert manifest["faker_version"] == faker_version()
    assert manifest["counts"]["forget"]["rows"] == len(splits["forget"])
    digest = manifest["fingerprint"]
    assert digest == load_data(out).fingerprint
    assert oct((out / "forget.jsonl").stat().st_mode & 0o777) == oct(0o644)

    # A previous dataset may be overwritten; a changed answer changes the fingerprint.
    changed = {s: [dict(r) for r in rows] for s, rows in splits.items()}
    changed["forget"][0]["answer"] = "someone.else@example.com"
    write_dataset(out, profiles, changed)
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8"))["fingerprint"] != digest
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_write_dataset_refuses_foreign_directories(tmp_path, profiles, splits):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious", encoding="utf-8")
    with pytest.raises(FileExistsError, match="not empty"):
        write_dataset(foreign, profiles, splits)
    assert sorted(p.name for p in foreign.iterdir()) == ["thesis.tex"]
    with pytest.raises(NotADirectoryError):
        write_dataset(foreign / "thesis.tex", profiles, splits)
    with pytest.raises(ValueError, match="missing"):
        write_dataset(tmp_path / "partial", profiles, {"forget": splits["forget"]})
    bad = {s: list(rows) for s, rows in splits.items()}
    bad["retain"] = [dict(bad["retain"][0], answer="  ")]
    with pytest.raises(ValueError, match="'answer' is empty"):
        write_dataset(tmp_path / "bad", profiles, bad)


def test_write_is_atomic_on_failure(tmp_path, profiles, splits, monkeypatch):
    out = write_dataset(tmp_path / "ds", profiles, splits)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).endswith("relearn.jsonl"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(spl.os, "replace", failing_replace)
    changed = {s: [dict(r, question=r["question"] + " ") for r in rows] for s, rows in splits.items()}
    with pytest.raises(OSError, match="disk full"):
        write_dataset(out, profiles, changed)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert (out / "relearn.jsonl").read_bytes() == before["relearn.jsonl"]  # never half-written
    assert (out / "manifest.json").read_bytes() == before["manifest.json"]  # still describes the old files


def test_generate_dataset_end_to_end(tmp_path):
    out = generate_dataset(tmp_path / "small", profiles=48, seed=5, people_per_field=6, validation_people=3)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["seed"] == 5 and manifest["parameters"]["people_per_field"] == 6
    assert manifest["counts"]["forget"]["by_field"] == {f.column: 6 for f in FIELDS.values()}
    assert manifest["counts"]["validation"]["rows"] == 2 * 2 * 3


# --------------------------------------------------------------------------------------------- bundled


def test_bundled_default_dataset_is_valid_and_matches_manifest():
    manifest = json.loads((BUNDLED / "manifest.json").read_text(encoding="utf-8"))
    for split in SPLITS:
        data = (BUNDLED / f"{split}.jsonl").read_bytes()
        rows = validate_rows(read_jsonl(BUNDLED / f"{split}.jsonl"), source=str(BUNDLED), split=split)
        assert len(rows) == manifest["counts"][split]["rows"] > 0
        assert manifest["files"][f"{split}.jsonl"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert load_data(BUNDLED).fingerprint == manifest["fingerprint"]
    assert manifest["seed"] == 42 and manifest["profiles"]["total"] == 1200
    for split in MAIN_SPLITS:
        assert manifest["counts"][split]["by_field"] == {f.column: 100 for f in FIELDS.values()}
    assert manifest["counts"]["validation"]["by_field"]["Email Address"] == 200


def test_generate_keeps_the_old_import_path():
    """lacuna_unlearn and older scripts import the split-out names from lacuna_tasks.synth.generate."""
    from lacuna_tasks.synth import generate

    assert generate.build_splits is build_splits and generate.write_dataset is write_dataset
    assert generate.generate_profiles is generate_profiles and generate.bio_texts is bio_texts
    assert set(generate.__all__) <= set(dir(generate))
