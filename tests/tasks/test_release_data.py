"""LACUNA's released data directory read as published (lacuna_tasks/release_data.py through the loader): the mapping of
its configs onto lacuna-bench's splits, the card and the no-card fallback, and a one-line error naming the file for
every way it can be broken. The data is written by tests/helpers/release.py from a small synthetic dataset (no model:
the whole release with models is tests/tasks/test_release_layout.py and the ``tiny_release`` fixture)."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from helpers.release import release_tables, write_release_data

from lacuna_tasks.harness.hooks import load_docs
from lacuna_tasks.loader import ENV_VAR, load_data, resolve_source
from lacuna_tasks.release_data import find_release
from lacuna_tasks.schema import FIELDS, FORGET_GROUPS, LacunaDataError
from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

CONFIGS = {"email": "Email_Address", "phone": "Phone_Number", "birth_city": "Birth_City",
           "drivers_license": "Drivers_License"}  # fmt: skip
MAIN = ("forget", "retain", "forget_paraphrased", "retain_paraphrased")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(lacuna-bench data directory, its splits, profiles by ID): the data the release below is written from."""
    root = tmp_path_factory.mktemp("release_source")
    profiles = generate_profiles(48, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=8, validation_people=4)
    return write_dataset(root / "data", profiles, splits), splits, {p["Unique ID"]: p for p in profiles}


@pytest.fixture(scope="module")
def release(source, tmp_path_factory):
    """``<root>/OLMo2-1B/data-masked``: the source's splits as LACUNA's release, card included."""
    _, splits, profiles = source
    dest = tmp_path_factory.mktemp("release") / "OLMo2-1B" / "data-masked"
    return write_release_data(dest, release_tables(splits, profiles))


@pytest.fixture
def copy(release, tmp_path):
    """A writable copy of the release (``data-masked``) to break."""
    return shutil.copytree(release, tmp_path / "OLMo2-1B" / "data-masked")


def _rows(path):
    return pq.read_table(path).to_pylist()


def _one_line_error(path, *needles):
    with pytest.raises(LacunaDataError) as info:
        load_data(path)
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert str(needle) in message, (needle, message)
    return message


def _rewrite(path, table):
    pq.write_table(table, path)


def _drop_from_card(dest, *names):
    card = dest / "README.md"
    meta = yaml.safe_load(card.read_text().split("---")[1])
    for config in meta["configs"]:
        config["data_files"] = [f for f in config["data_files"] if f["path"].split("/")[-1] not in names]
    meta["configs"] = [c for c in meta["configs"] if c["data_files"]]
    card.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n")


# -- loading ------------------------------------------------------------------------------------------------------


def test_the_release_loads_as_the_data_it_was_written_from(source, release):
    """Concatenating the per-field files in field order gives back lacuna-bench's splits row for row: the same
    content fingerprint as the JSONL directory, through the directory as downloaded and through its data/."""
    data_dir, _, _ = source
    ours, theirs = load_data(data_dir), load_data(release)
    assert theirs.splits == {s: ours.splits[s] for s in theirs.splits}
    assert sorted(theirs.splits) == ["forget", "forget_paraphrased", "relearn", "retain", "retain_paraphrased",
                                     "validation"]  # fmt: skip
    assert theirs.fingerprint == ours.fingerprint
    assert theirs.source == str(release.resolve())
    subfolder = load_data(release / "data")
    assert subfolder.source == theirs.source and subfolder.fingerprint == theirs.fingerprint


def test_provenance_names_the_files_and_what_was_not_used(release):
    data = load_data(release)
    data_dir = release.resolve() / "data"
    assert data.files["forget"].split(", ") == [str(data_dir / f"{c}_forget.parquet") for c in CONFIGS.values()]
    assert data.files["validation"].split(", ") == [
        str(data_dir / f"validation_{c}_{side}.parquet")
        for c in ("Email_Address", "Drivers_License")
        for side in ("forget", "retain")
    ]
    assert data.files["relearn"] == str(data_dir / "relearn_train.parquet")
    provenance = data.provenance()
    assert provenance["layout"] == "lacuna-release" and provenance["source"] == str(release.resolve())
    assert set(provenance["unused"]) == {f"{c}/full" for c in CONFIGS.values()} | {
        f"validation_{c}/{s}"
        for c in ("Email_Address", "Drivers_License")
        for s in ("forget_paraphrased", "retain_paraphrased", "full")
    }
    assert data.release["classified_by"] == "card" and data.release["card"] == str(release.resolve() / "README.md")
    assert data.release["configs"]["Email_Address/forget"] == {
        "file": "data/Email_Address_forget.parquet",
        "split": "forget",
        "rows": len(data.rows("forget", "email")),
    }


@pytest.mark.parametrize("field", list(FIELDS))
def test_rows_per_field_are_the_fields_files(release, field):
    data = load_data(release)
    config = CONFIGS[field]
    for split in MAIN:
        assert data.rows(split, field) == _rows(release / "data" / f"{config}_{split}.parquet")
    validation = release / "data" / f"validation_{config}_forget.parquet"
    if validation.exists():  # email and driver's license: both sides' validation people, one question each
        expected = _rows(validation) + _rows(release / "data" / f"validation_{config}_retain.parquet")
        assert data.rows("validation", field) == expected
        assert {r["group_id"] in FORGET_GROUPS for r in expected} == {True, False}
    else:
        with pytest.raises(LacunaDataError, match="has no rows for field"):
            data.rows("validation", field)
    relearn = [r for r in _rows(release / "data" / "relearn_train.parquet") if r["field"] == FIELDS[field].column]
    assert data.rows("relearn", field) == relearn


def test_without_a_card_files_are_classified_by_name(release, copy):
    (copy / "README.md").unlink()
    (copy / "data" / "notes.parquet").write_bytes(b"not read")  # no <Config>_<split> name: skipped, as LACUNA does
    data = load_data(copy)
    assert data.fingerprint == load_data(release).fingerprint
    assert data.release["classified_by"] == "file names" and data.release["card"] is None
    assert data.release["ignored"] == ["notes.parquet"]
    assert load_data(copy / "data").fingerprint == data.fingerprint


def test_a_readme_without_configs_falls_back_to_file_names(release, copy):
    (copy / "README.md").write_text("# LACUNA memorized PII dataset\n")
    assert load_data(copy).release["classified_by"] == "file names"


def test_the_card_decides_which_file_is_which_split(release, copy):
    """A card may name any file: the loader follows it, as ``load_dataset(dir, name=...)`` does."""
    (copy / "data" / "Email_Address_forget.parquet").rename(copy / "data" / "email-forget-v2.parquet")
    card = copy / "README.md"
    card.write_text(card.read_text().replace("data/Email_Address_forget.parquet", "data/email-forget-v2.parquet"))
    data = load_data(copy)
    assert data.fingerprint == load_data(release).fingerprint
    assert str(copy.resolve() / "data" / "email-forget-v2.parquet") in data.files["forget"]


def test_a_person_in_one_fields_forget_split_and_absent_from_another(source, tmp_path):
    """Rows whose value was missing are dropped per field: the release passes validation, and each field's rows are
    its own."""
    _, splits, profiles = source
    person = sorted(r["ID"] for r in splits["forget"] if r["field"] == "Phone Number")[0]
    dest = write_release_data(
        tmp_path / "data-masked", release_tables(splits, profiles, absent={"Phone Number": [person]})
    )
    data = load_data(dest)
    assert person in {r["ID"] for r in data.rows("forget", "email")}
    assert person not in {r["ID"] for r in data.rows("forget", "phone")}
    assert person not in {r["ID"] for r in data.rows("forget_paraphrased", "phone")}


def test_optional_configs(release, copy):
    """Validation and relearn configs are optional: a release without them loads without those splits."""
    for path in (copy / "data").glob("validation_*"):
        path.unlink()
    (copy / "data" / "relearn_train.parquet").unlink()
    (copy / "README.md").unlink()
    data = load_data(copy)
    assert sorted(data.splits) == ["forget", "forget_paraphrased", "retain", "retain_paraphrased"]
    assert not data.has_split("validation") and not data.has_split("relearn")


def test_every_source_selector_reads_the_release(release, monkeypatch):
    """lm-eval's --metadata lacuna_data and $LACUNA_DATA reach the same loader; the docs carry its provenance."""
    monkeypatch.setenv(ENV_VAR, str(release))
    assert resolve_source({}) == str(release)
    dd = load_docs(field="email", side="forget", kind="qa", lacuna_data=str(release), pretrained="ignored")
    info = json.loads(dd["test"].info.description)["lacuna_data"]
    assert info["source"] == str(release.resolve()) and info["layout"] == "lacuna-release"
    assert info["fingerprint"] == load_data(release).fingerprint
    assert sorted(d["question"] for d in dd["test"]) == sorted(
        r["question"] for r in _rows(release / "data" / "Email_Address_forget.parquet")
    )


def test_crossfield_retain_rows_come_from_the_paired_fields_files(release):
    """``retain_field: crossfield`` pairs fields as LACUNA's ``*_CrossField`` configs do, on release data too."""
    from lacuna_unlearn.qa.unlearn_data import CROSSFIELD_RETAIN, unlearning_rows

    data = load_data(release)
    for field, (paired, with_paraphrased) in CROSSFIELD_RETAIN.items():
        forget, retain, sources = unlearning_rows(data, field=field, retain_field="crossfield")
        assert forget == _rows(release / "data" / f"{CONFIGS[field]}_forget.parquet")
        expected = _rows(release / "data" / f"{CONFIGS[paired]}_retain.parquet")
        if with_paraphrased:
            expected += _rows(release / "data" / f"{CONFIGS[paired]}_retain_paraphrased.parquet")
        assert retain == expected, field
        assert sources[0] == ("retain", paired)


def test_a_changed_file_is_read_again(copy):
    before = load_data(copy)
    path = copy / "data" / "Email_Address_forget.parquet"
    table = pq.read_table(path)
    questions = table.column("question").to_pylist()
    questions[0] += " Answer briefly."
    _rewrite(path, table.set_column(table.schema.get_field_index("question"), "question", pa.array(questions)))
    after = load_data(copy)
    assert after.fingerprint != before.fingerprint
    assert after.rows("forget", "email")[0]["question"] == questions[0]


def test_find_release_recognises_only_the_release(release, source, tmp_path):
    data_dir, _, _ = source
    assert find_release(release).root == release and find_release(release).card == release / "README.md"
    assert find_release(release / "data").root == release
    assert find_release(data_dir) is None
    assert find_release(tmp_path) is None


# -- errors: one line naming the file -----------------------------------------------------------------------------


def test_a_directory_in_neither_layout_names_what_it_found_and_both_layouts(tmp_path):
    odd = tmp_path / "downloads"
    (odd / "subdir").mkdir(parents=True)
    (odd / "notes.txt").write_text("x")
    message = _one_line_error(odd, odd, "no LACUNA splits found", "found 2 entries: notes.txt, subdir/",
                              "<split>.jsonl", "save_to_disk", "data-<regime>/", "data/<Config>_<split>.parquet")  # fmt: skip
    assert "README.md" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(empty, empty, "it is empty")


def test_the_size_directory_points_to_its_data_directories(release):
    size = release.parent  # <root>/OLMo2-1B holds data-masked/ (and, in the release, the models)
    _one_line_error(size, "no LACUNA splits found", "data-masked/", f"LACUNA's release data is in {release}")


def test_a_card_naming_a_missing_file(copy):
    (copy / "data" / "Birth_City_retain.parquet").unlink()
    _one_line_error(copy, copy / "README.md", "data/Birth_City_retain.parquet", "does not exist")


def test_malformed_card(copy):
    (copy / "README.md").write_text("---\nconfigs: [unclosed\n---\n")
    _one_line_error(copy, copy / "README.md", "malformed YAML")


@pytest.mark.parametrize("card", [True, False], ids=["card", "no-card"])
def test_a_missing_field_config(copy, card):
    """All four field configs are required (the release always has them): a missing one names its forget file."""
    names = [p.name for p in (copy / "data").glob("Email_Address_*")]
    for name in names:
        (copy / "data" / name).unlink()
    if card:
        _drop_from_card(copy, *names)
    else:
        (copy / "README.md").unlink()
    _one_line_error(copy, copy / "data" / "Email_Address_forget.parquet", "no config 'Email_Address'",
                    "found configs: Birth_City, Drivers_License, Phone_Number")  # fmt: skip


@pytest.mark.parametrize("split", MAIN)
def test_a_missing_split_of_a_present_field(copy, split):
    name = f"Phone_Number_{split}.parquet"
    (copy / "data" / name).unlink()
    _drop_from_card(copy, name)
    _one_line_error(copy, copy / "data" / name, f"has no split {split!r}", "'Phone_Number'")


def test_a_validation_config_needs_both_sides(copy):
    (copy / "data" / "validation_Email_Address_retain.parquet").unlink()
    (copy / "README.md").unlink()
    _one_line_error(copy, copy / "data" / "validation_Email_Address_retain.parquet", "validation config")


def test_a_misspelt_file_is_ignored_and_named_when_its_config_is_missing(copy):
    (copy / "data" / "Email_Address_forget.parquet").rename(copy / "data" / "Email_Adress_forget.parquet")
    (copy / "README.md").unlink()
    _one_line_error(copy, "Email_Address_forget.parquet", "ignored", "Email_Adress_forget.parquet")


@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        ("answer", None, ["missing column(s) ['answer']"]),
        ("question", "Question", ["missing column(s) ['question']", "'Question' instead of 'question'"]),
        ("group_id", "groupid", ["missing column(s) ['group_id']"]),
    ],
    ids=["missing", "renamed-case", "renamed"],
)
def test_a_missing_or_renamed_column(copy, old, new, needles):
    path = copy / "data" / "Drivers_License_retain.parquet"
    table = pq.read_table(path)
    if new is None:
        table = table.drop_columns([old])
    else:
        table = table.rename_columns([new if n == old else n for n in table.column_names])
    _rewrite(path, table)
    _one_line_error(path.parent.parent, path, *needles)


def test_a_renamed_column_in_an_unused_file_is_refused_too(copy):
    path = copy / "data" / "Birth_City_full.parquet"
    table = pq.read_table(path)
    _rewrite(path, table.rename_columns(["id" if n == "ID" else n for n in table.column_names]))
    _one_line_error(copy, path, "'id' instead of 'ID'")


@pytest.mark.parametrize(("kind", "shown"), [(pa.float64(), "double"), (pa.string(), "string")])
def test_group_id_not_an_integer(copy, kind, shown):
    path = copy / "data" / "Phone_Number_forget.parquet"
    table = pq.read_table(path)
    column = table.column("group_id").cast(kind)
    _rewrite(path, table.set_column(table.schema.get_field_index("group_id"), "group_id", column))
    _one_line_error(copy, path, "column 'group_id'", f"type {shown}", "integer")


def test_a_row_of_another_field(copy):
    path = copy / "data" / "Email_Address_forget.parquet"
    table = pq.read_table(path)
    fields = table.column("field").to_pylist()
    fields[2] = "Phone Number"
    _rewrite(path, table.set_column(table.schema.get_field_index("field"), "field", pa.array(fields)))
    _one_line_error(copy, path, "row 2", "'Phone Number'", "'Email Address'")


def test_an_unreadable_parquet_file(copy):
    path = copy / "data" / "Email_Address_retain.parquet"
    path.write_bytes(b"PAR1 not really")
    _one_line_error(copy, path, "unreadable parquet file")


def test_a_bad_row_names_its_file_and_its_row_in_that_file(copy):
    path = copy / "data" / "Birth_City_forget.parquet"
    table = pq.read_table(path)
    answers = table.column("answer").to_pylist()
    answers[3] = "   "
    _rewrite(path, table.set_column(table.schema.get_field_index("answer"), "answer", pa.array(answers)))
    _one_line_error(copy, f"{path}: split 'forget' row 3 column 'answer' is empty")


def test_a_relation_across_files_names_the_file_holding_the_row(copy):
    """Rows are concatenated per split; a broken relation still names the file and the row's index in it."""
    forget = _rows(copy / "data" / "Email_Address_forget.parquet")
    path = copy / "data" / "Birth_City_retain.parquet"
    table = pq.read_table(path)
    ids = table.column("ID").to_pylist()
    ids[2] = forget[0]["ID"]
    _rewrite(path, table.set_column(table.schema.get_field_index("ID"), "ID", pa.array(ids)))
    _one_line_error(copy, f"{path}: split 'retain' row 2", "Email_Address_forget.parquet", forget[0]["ID"])


def test_two_files_for_one_split(copy):
    card = copy / "README.md"
    meta = yaml.safe_load(card.read_text().split("---")[1])
    email = next(c for c in meta["configs"] if c["config_name"] == "Email_Address")
    email["data_files"].append({"split": "forget", "path": "data/Email_Address_full.parquet"})
    card.write_text("---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n")
    _one_line_error(copy, copy / "data" / "Email_Address_full.parquet", "a second file", "'forget'")
