"""Data sources, source selection, fingerprints and clear errors for bad data."""

from __future__ import annotations

import json

import pytest

from lacuna_tasks.harness.hooks import build_docs, load_docs
from lacuna_tasks.loader import BUNDLED_NAME, ENV_VAR, load_data, resolve_source
from lacuna_tasks.schema import LacunaDataError


def _row(i, field="Email Address", group=0, **over):
    row = {
        "ID": f"p{i}",
        "question": f"Per{i} Son{i}, born in X. What is his {field}?",
        "answer": f"per{i}@x.org",
        "field": field,
        "group_id": group,
    }
    row.update(over)
    return row


def _write(dir_, split, rows):
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def small_dir(tmp_path):
    d = tmp_path / "data"
    _write(d, "forget", [_row(i, group=0) for i in range(3)])
    _write(d, "retain", [_row(i, group=1) for i in range(3, 8)])
    return d


def test_source_precedence(monkeypatch, small_dir):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_source({}) == BUNDLED_NAME
    monkeypatch.setenv(ENV_VAR, "/from/env")
    assert resolve_source({}) == "/from/env"
    assert resolve_source({"lacuna_data": str(small_dir)}) == str(small_dir)


def test_bundled_default_loads():
    data = load_data()
    assert data.source == BUNDLED_NAME
    assert data.fingerprint.startswith("sha256:")
    assert len(data.rows("forget", "email")) == 100 and len(data.rows("retain", "phone")) == 100
    assert data.profiles is not None


def test_dir_parquet_datasets_and_resolve_testbeds_agree(tmp_path, small_dir):
    import datasets

    jsonl = load_data(small_dir)
    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    for split, rows in jsonl.splits.items():
        datasets.Dataset.from_list(rows).to_parquet(str(pq_dir / f"{split}.parquet"))
    disk = tmp_path / "saved"
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in jsonl.splits.items()}).save_to_disk(str(disk))
    testbed = tmp_path / "testbed"
    (testbed / "data").mkdir(parents=True)
    for split in jsonl.splits:
        (testbed / "data" / f"{split}.jsonl").write_text((small_dir / f"{split}.jsonl").read_text())
    prints = {load_data(p).fingerprint for p in (small_dir, pq_dir, disk, testbed)}
    assert prints == {jsonl.fingerprint}


def test_fingerprint_changes_with_content(tmp_path, small_dir):
    before = load_data(small_dir).fingerprint
    _write(small_dir, "forget", [_row(i, group=0, answer="changed@x.org") for i in range(3)])
    assert load_data(small_dir).fingerprint != before


def test_provenance_reaches_the_docs(small_dir):
    dd = load_docs(field="email", side="forget", kind="qa", lacuna_data=str(small_dir), pretrained="ignored")
    info = json.loads(dd["test"].info.description)
    assert info["lacuna_data"]["source"] == str(small_dir.resolve())
    assert info["lacuna_data"]["fingerprint"] == load_data(small_dir).fingerprint


def test_worstcase_docs_are_32_per_person_sorted(small_dir):
    docs = build_docs(load_data(small_dir), field="email", side="forget", kind="worstcase")
    assert len(docs) == 3 * 32
    assert [d["person"] for d in docs] == sorted(d["person"] for d in docs)
    first = [d for d in docs if d["person"] == "p0"]
    assert [d["setting"] for d in first] == ["plain"] * 16 + ["icr"] * 16
    assert len({d["prompt"] for d in first}) == 32
    assert first[0]["question"] == _row(0)["question"]  # variant 0 = the original question
    assert all(d["prompt"].count("Q: ") == 4 for d in first[16:])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("answer"), r"forget\.jsonl: split 'forget' row 0 lacks column\(s\) \['answer'\]"),
        (lambda r: r.update(answer=12345), r"forget\.jsonl: split 'forget' row 0 column 'answer' must be a string"),
        (lambda r: r.update(answer="  "), r"column 'answer' is empty"),
        (lambda r: r.update(field="SSN"), r"unknown field 'SSN'"),
        (lambda r: r.update(group_id="g"), r"column 'group_id' must be an integer"),
    ],
)
def test_bad_rows_name_file_split_row_and_column(tmp_path, mutate, message):
    row = _row(0)
    mutate(row)
    _write(tmp_path, "forget", [row])
    with pytest.raises(LacunaDataError, match=message):
        load_data(tmp_path)


def test_missing_path_and_missing_splits(tmp_path):
    with pytest.raises(LacunaDataError, match="does not exist"):
        load_data(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LacunaDataError, match="no LACUNA splits found"):
        load_data(tmp_path / "empty")


def test_missing_or_empty_split_for_a_task(tmp_path):
    _write(tmp_path, "forget", [_row(0)])
    data = load_data(tmp_path)
    with pytest.raises(LacunaDataError, match="no split 'retain'"):
        build_docs(data, field="email", side="retain", kind="qa")
    with pytest.raises(LacunaDataError, match="has no rows for field 'Phone Number'"):
        build_docs(data, field="phone", side="forget", kind="qa")
    (tmp_path / "retain.jsonl").write_text("")
    with pytest.raises(LacunaDataError, match="retain.jsonl\\) is empty|has no rows"):
        load_data(tmp_path).rows("retain")


def test_malformed_json_names_file_and_line(tmp_path):
    (tmp_path / "forget.jsonl").write_text(json.dumps(_row(0)) + "\n{not json\n")
    with pytest.raises(LacunaDataError, match=r"forget\.jsonl:2: malformed JSON"):
        load_data(tmp_path)


def test_unknown_kind_side_field(small_dir):
    data = load_data(small_dir)
    with pytest.raises(LacunaDataError, match="unknown field 'ssn'"):
        build_docs(data, field="ssn", side="forget", kind="qa")
    with pytest.raises(LacunaDataError, match="unknown side"):
        build_docs(data, field="email", side="both", kind="qa")
    with pytest.raises(LacunaDataError, match="forget side only"):
        build_docs(data, field="email", side="retain", kind="worstcase")
