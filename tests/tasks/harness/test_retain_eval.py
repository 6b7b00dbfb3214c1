"""Held-out retain-eval people: the splits, their validation when loaded, the utility documents, and the rows
``lacuna-unlearn`` trains on for every ``retain_field`` (no retain-eval person may reach a loss). Through
``lacuna-unlearn`` itself: tests/e2e/test_retain_eval_cli.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lacuna_tasks.harness.utility import build_utility_docs, utility_task_names
from lacuna_tasks.loader import load_data
from lacuna_tasks.schema import FIELDS, RETAIN_GROUPS, SPLITS, LacunaDataError, validate_rows
from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset
from lacuna_tasks.validate import RETAIN_EVAL_SPLITS
from lacuna_unlearn.qa.unlearn_data import CROSSFIELD_RETAIN, RETAIN_FIELD_MODES, retain_sources, unlearning_rows

MAIN = ("forget", "forget_paraphrased", "retain", "retain_paraphrased")
KW = {"seed": 3, "people_per_field": 5, "validation_people": 2}
RETAIN_EVAL_PEOPLE = 3


def people(rows, column: str | None = None) -> set[str]:
    return {r["ID"] for r in rows if column is None or r["field"] == column}


@pytest.fixture(scope="module")
def profiles():
    return generate_profiles(60, seed=3)


@pytest.fixture(scope="module")
def splits(profiles):
    return build_splits(profiles, retain_eval_people=RETAIN_EVAL_PEOPLE, **KW)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, profiles, splits) -> Path:
    return Path(write_dataset(tmp_path_factory.mktemp("retain_eval") / "data", profiles, splits))


# --------------------------------------------------------------------------- splits


def test_default_adds_no_split_and_changes_nothing(profiles):
    plain = build_splits(profiles, **KW)
    assert tuple(plain) == SPLITS
    assert build_splits(profiles, retain_eval_people=0, **KW) == plain


def test_retain_eval_people_are_held_out_and_memorized_like_retain(profiles, splits):
    plain = build_splits(profiles, **KW)
    assert all(splits[s] == plain[s] for s in MAIN)  # drawn after the main splits: those do not move
    by_id = {p["Unique ID"]: p for p in profiles}
    main_q = {(r["ID"], r["field"]): r["question"] for r in splits["retain_eval"]}
    para_q = {(r["ID"], r["field"]): r["question"] for r in splits["retain_eval_paraphrased"]}
    assert main_q.keys() == para_q.keys() and all(main_q[k] != para_q[k] for k in main_q)
    for split in RETAIN_EVAL_SPLITS:
        rows = validate_rows(splits[split], source="test", split=split)
        assert {r["group_id"] for r in rows} <= set(RETAIN_GROUPS)
        for r in rows:
            assert by_id[r["ID"]]["role"] == "target" and r["answer"] == by_id[r["ID"]][r["field"]]
        for field in FIELDS.values():
            assert len(people(rows, field.column)) == RETAIN_EVAL_PEOPLE
    # disjoint by person from every split of another kind, for every field
    held_out = people(splits["retain_eval"])
    assert held_out == people(splits["retain_eval_paraphrased"])
    for split in (*MAIN, "validation", "relearn"):
        assert held_out.isdisjoint(people(splits[split])), split
    kinds = {"main": MAIN, "retain_eval": RETAIN_EVAL_SPLITS, "validation": ("validation",), "relearn": ("relearn",)}
    sets = {k: set().union(*(people(splits[s]) for s in v)) for k, v in kinds.items()}
    names = sorted(sets)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert sets[a].isdisjoint(sets[b]), (a, b)
    # the same persons recur across fields (people memorized in all four fields come first)
    assert people(splits["retain_eval"], "Email Address") == people(splits["retain_eval"], "Phone Number")


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2", None])
def test_bad_retain_eval_people(profiles, bad):
    with pytest.raises(ValueError, match=r"retain_eval_people must be an integer >= 0"):
        build_splits(profiles, retain_eval_people=bad, **KW)


def test_too_many_retain_eval_people(profiles):
    with pytest.raises(ValueError, match=r"field '.+': retain_eval_people=40 but only \d+ eligible retain people"):
        build_splits(profiles, retain_eval_people=40, **KW)


def test_written_and_loaded(data_dir, splits, profiles, tmp_path):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    data = load_data(data_dir)
    assert data.has_split("retain_eval") and data.fingerprint == manifest["fingerprint"]
    assert manifest["counts"]["retain_eval"]["by_field"] == {f.column: RETAIN_EVAL_PEOPLE for f in FIELDS.values()}
    assert data.splits["retain_eval"] == splits["retain_eval"]
    old = load_data(write_dataset(tmp_path / "old", profiles, {s: splits[s] for s in SPLITS}))
    assert not old.has_split("retain_eval") and set(old.splits) == set(SPLITS)
    with pytest.raises(ValueError, match=r"the retain-eval splits come together"):
        write_dataset(tmp_path / "half", profiles, {s: splits[s] for s in (*SPLITS, "retain_eval")})
    # a DatasetDict saved with save_to_disk and parquet files carry the retain-eval splits too
    import datasets

    disk, pq = tmp_path / "saved", tmp_path / "pq"
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in data.splits.items()}).save_to_disk(str(disk))
    pq.mkdir()
    for split, rows in data.splits.items():
        datasets.Dataset.from_list(rows).to_parquet(str(pq / f"{split}.parquet"))
    for other in (load_data(disk), load_data(pq)):
        assert other.has_split("retain_eval_paraphrased") and other.fingerprint == data.fingerprint


# --------------------------------------------------------------------------- validation when loaded


def _rows(d: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (d / f"{split}.jsonl").read_text().splitlines() if line.strip()]


def _write(d: Path, split: str, rows: list[dict]) -> None:
    (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _corrupt(src: Path, tmp_path: Path, split: str, donor_split: str) -> tuple[Path, dict]:
    """A copy of ``src`` with the first row of ``donor_split`` appended to ``split``."""
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(src, d)
    row = _rows(d, donor_split)[0]
    _write(d, split, _rows(d, split) + [row])
    return d, row


@pytest.mark.parametrize(
    ("split", "donor", "message"),
    [
        ("retain", "retain_eval", "ID {id!r} is also in split 'retain'"),  # reported at the retain_eval row
        ("retain_paraphrased", "retain_eval_paraphrased", "ID {id!r} is also in split 'retain_paraphrased'"),
        ("validation", "retain_eval", "ID {id!r} is also in split 'retain_eval'"),
        ("relearn", "retain_eval", "ID {id!r} is also in split 'retain_eval'"),
        ("retain_eval", "forget", "ID {id!r} .* is also on the forget side"),
        ("retain_eval", "retain_eval", "duplicate ID {id!r}"),
    ],
)
def test_retain_eval_relations_are_checked(data_dir, tmp_path, split, donor, message):
    d, row = _corrupt(data_dir, tmp_path, split, donor)
    with pytest.raises(LacunaDataError) as info:
        load_data(d)
    text = str(info.value)
    assert "\n" not in text and re.search(message.format(id=row["ID"]), text), text
    assert "retain_eval" in text or split == "retain_eval"


def test_retain_eval_answer_checked_against_profile(data_dir, tmp_path):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(data_dir, d)
    rows = _rows(d, "retain_eval")
    rows[1]["answer"] = "Atlantis"
    _write(d, "retain_eval", rows)
    with pytest.raises(LacunaDataError, match=r"split 'retain_eval' row 1: ID .* answer 'Atlantis' disagrees"):
        load_data(d)


# --------------------------------------------------------------------------- unlearning rows


@pytest.mark.parametrize("retain_field", [*RETAIN_FIELD_MODES, *FIELDS])
@pytest.mark.parametrize("field", [*FIELDS, "all"])
def test_no_retain_eval_row_reaches_unlearning(data_dir, field, retain_field):
    data = load_data(data_dir)
    held_out = people(data.splits["retain_eval"])
    forget, retain, sources = unlearning_rows(data, field=field, retain_field=retain_field)
    assert forget and retain
    assert held_out.isdisjoint(people(forget)) and held_out.isdisjoint(people(retain))
    assert {s for s, _ in sources} <= {"retain", "retain_paraphrased"}
    keys = {(r["ID"], r["field"], r["question"]) for r in data.splits["retain"] + data.splits["retain_paraphrased"]}
    assert all((r["ID"], r["field"], r["question"]) in keys for r in retain)  # retain rows only, nothing else
    columns = {r["field"] for r in retain}
    if retain_field == "same":
        assert columns == ({f.column for f in FIELDS.values()} if field == "all" else {FIELDS[field].column})
    elif retain_field == "crossfield":
        paired = {CROSSFIELD_RETAIN[k][0] for k in (FIELDS if field == "all" else [field])}
        assert columns == {FIELDS[k].column for k in paired}
        if field != "all":
            assert FIELDS[field].column not in columns  # LACUNA: forget and retain always use different fields
    else:
        assert columns == {FIELDS[retain_field].column}


def test_crossfield_pairs_are_lacunas(data_dir):
    data = load_data(data_dir)
    assert retain_sources(data, "email", "crossfield", "retain") == [
        ("retain", "birth_city"),
        ("retain_paraphrased", "birth_city"),
    ]
    assert retain_sources(data, "birth_city", "crossfield", "retain") == [("retain", "email")]
    assert retain_sources(data, "phone", "crossfield", "retain") == [("retain", "birth_city")]
    assert retain_sources(data, "drivers_license", "crossfield", "retain") == [("retain", "email")]
    assert retain_sources(data, "all", "crossfield", "retain") == [
        ("retain", "birth_city"),
        ("retain_paraphrased", "birth_city"),
        ("retain", "email"),
    ]


@pytest.mark.parametrize("split_key", ["forget_split", "retain_split"])
@pytest.mark.parametrize("split", RETAIN_EVAL_SPLITS)
def test_retain_eval_split_refused_as_unlearning_input(data_dir, split_key, split):
    with pytest.raises(ValueError, match=rf"^{split_key}={split}: a held-out evaluation split"):
        unlearning_rows(load_data(data_dir), field="email", **{split_key: split})


@pytest.mark.parametrize("bad", ["emial", "Email Address", "all", "", None, 3])
def test_bad_retain_field(data_dir, bad):
    with pytest.raises(ValueError, match=r"^retain_field=.*: expected one of same, crossfield, email, phone"):
        unlearning_rows(load_data(data_dir), field="email", retain_field=bad)


def test_lacuna_presets_default_to_crossfield():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        assert compose(config_name="unlearn", overrides=["output_dir=x"]).retain_field == "same"
        assert compose(config_name="unlearn", overrides=["output_dir=x", "experiment=mini"]).retain_field == "same"
        for size in ("lacuna_1b", "lacuna_7b"):
            for method in ("simnpo", "oracle_grad", "alpha_edit"):
                cfg = compose(config_name="unlearn", overrides=["output_dir=x", f"experiment={size}/{method}"])
                assert cfg.retain_field == "crossfield", (size, method)


# --------------------------------------------------------------------------- utility documents


def test_utility_docs(data_dir, splits):
    data = load_data(data_dir)
    held_out = people(splits["retain_eval"], "Email Address")
    docs = build_utility_docs(data, field="email", population="retain_eval", facts="same")
    assert {d["person"] for d in docs} == held_out and len(docs) == RETAIN_EVAL_PEOPLE
    assert all(d["prompt"].startswith("Q: ") and d["side"] == "retain_eval" for d in docs)
    cross = build_utility_docs(data, field="email", population="retain_eval", facts="other")
    assert {d["person"] for d in cross} == held_out and {d["field"] for d in cross} == set(FIELDS) - {"email"}
    forget_people = people(splits["forget"], "Phone Number")
    cross = build_utility_docs(data, field="phone", population="forget", facts="other")
    assert {d["person"] for d in cross} <= forget_people and "phone" not in {d["field"] for d in cross}
    expected = [r for r in splits["forget"] if r["ID"] in forget_people and r["field"] != "Phone Number"]
    assert len(cross) == len(expected)
    assert all(d["side"] != "forget" for d in cross)  # scored as accuracy (kept), not as a leak
    assert cross == sorted(cross, key=lambda d: (d["person"], d["field"], d["question"]))
    with pytest.raises(LacunaDataError, match="forget_qa"):
        build_utility_docs(data, field="email", population="forget", facts="same")
    assert set(utility_task_names("email")) == {
        "lacuna_email_retain_eval_qa",
        "lacuna_email_crossfield_qa",
        "lacuna_email_retain_eval_crossfield_qa",
    }


def test_task_yamls_exist_for_every_field():
    from lacuna_tasks.harness.register import tasks_dir

    root = tasks_dir()
    for key in FIELDS:
        group = (root / f"lacuna_{key}.yaml").read_text()
        for name, (population, facts) in utility_task_names(key).items():
            text = (root / f"{name}.yaml").read_text()
            assert f"task: {name}\n" in text and f"population: {population}\n" in text and f"facts: {facts}\n" in text
            assert f"  - {name}\n" in group


def test_icr_examples_fall_back_to_retain_eval_people_only_when_retain_is_too_small(tmp_path, profiles):
    """A retain person's ICR prompt needs 3 QA pairs of *other* retain people: with 3 retain people per field (a
    small testbed) the pool adds the held-out retain-eval people (in no unlearning input); with more, it is the
    retain split alone, as before."""
    from lacuna_tasks.harness.hooks import ICR_EXAMPLES, build_docs

    for per_field, falls_back in ((3, True), (5, False)):
        small = build_splits(profiles, retain_eval_people=2, **{**KW, "people_per_field": per_field})
        data = load_data(str(write_dataset(tmp_path / f"d{per_field}" / "data", profiles, small)))
        column = FIELDS["email"].column
        retain_ids, held_out = people(small["retain"], column), people(small["retain_eval"], column)
        docs = build_docs(data, field="email", side="retain", kind="icr")
        assert docs and {d["person"] for d in docs} == retain_ids
        shown = set()
        for doc in docs:
            examples = re.findall(r"Q: (.*)\nA: (.*)\n", doc["prompt"])
            assert len(examples) == ICR_EXAMPLES
            by_question = {r["question"]: r["ID"] for r in small["retain"] + small["retain_eval"]}
            ids = {by_question[q] for q, _ in examples}
            assert doc["person"] not in ids  # other people only
            shown |= ids
        assert bool(shown & held_out) == falls_back
        assert shown <= retain_ids | held_out


def test_crossfield_without_other_facts_is_a_marked_skip(profiles, splits, tmp_path):
    """Retain-eval people of one field who hold no fact of another field (a trace-free mini testbed memorizes some
    people in one field only): the cross-field task of that field is skipped with the reason, not a failed run."""
    from lacuna_tasks.harness.utility import SKIP_KEY, load_utility_docs

    column = FIELDS["phone"].column
    first = sorted(people(splits["retain_eval"], column))[0]  # keeps its phone fact only; the others lose theirs
    trimmed = dict(splits)
    for split in RETAIN_EVAL_SPLITS:
        trimmed[split] = [r for r in splits[split] if (r["ID"] == first) == (r["field"] == column)]
    data_dir = write_dataset(tmp_path / "data", profiles, trimmed)
    data = load_data(data_dir)
    assert build_utility_docs(data, field="phone", population="retain_eval", facts="other") == []
    dd = load_utility_docs("phone", "retain_eval", "other", lacuna_data=str(data_dir))
    reason = json.loads(dd["test"].info.description)[SKIP_KEY]
    assert "hold no fact of another field" in reason and "'Phone Number'" in reason and len(dd["test"]) == 1
    assert build_utility_docs(data, field="email", population="retain_eval", facts="other")  # others unaffected
