"""The models ``lacuna meta`` pools beyond a run's chosen stopping points (issue 38): a LACUNA ``unlearned_models/``
tree as published, a YAML list, a lacuna-unlearn checkpoint, the run's other stopping points; each bad input
refused in one line naming the path, item or field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lacuna_unlearn.bench.meta.run import MetaSettings
from lacuna_unlearn.bench.meta.sources import check_points, other_points, read_checkpoints

FIELDS = ["email", "phone"]


def _checkpoint(path: Path, manifest: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "olmo2"}))
    if manifest is not None:
        (path / "unlearn_manifest.json").write_text(json.dumps(manifest))
    return path


def _release_tree(root: Path) -> Path:
    """A regime directory as LACUNA's scripts leave it: two checkpoints and one results-only method directory."""
    tree = root / "masked" / "unlearned_models"
    _checkpoint(tree / "Email_Address" / "GradDiff_OracleGrad")
    _checkpoint(tree / "Phone_Number" / "SimNPO")
    (tree / "Phone_Number" / "RMU").mkdir(parents=True)
    (tree / "Phone_Number" / "RMU" / "Panorama_SUMMARY.json").write_text("{}")
    return root / "masked"


def test_the_release_tree_is_read_as_published_with_lacuna_names_mapped_back(tmp_path):
    regime = _release_tree(tmp_path)
    for spec in (regime, regime / "unlearned_models"):  # the regime directory or its tree
        models, skipped = read_checkpoints([spec], FIELDS)
        assert [(m.method, m.field, m.point) for m in models] == [
            ("oracle_grad", "email", "checkpoint"),
            ("simnpo", "phone", "checkpoint"),
        ]
        assert len(skipped) == 1 and "RMU" in skipped[0] and "no config.json" in skipped[0]


def test_an_unknown_field_directory_an_empty_tree_and_a_missing_path_are_refused_naming_them(tmp_path):
    tree = tmp_path / "unlearned_models"
    _checkpoint(tree / "Shoe_Size" / "GradDiff")
    with pytest.raises(ValueError, match=r"Shoe_Size: not a LACUNA field directory"):
        read_checkpoints([tree], FIELDS)
    empty = tmp_path / "empty" / "unlearned_models"
    (empty / "Email_Address" / "RMU").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no checkpoint under <Field>/<Method>/"):
        read_checkpoints([empty], FIELDS)
    with pytest.raises(FileNotFoundError, match=r"--checkpoints .*nowhere: not found"):
        read_checkpoints([tmp_path / "nowhere"], FIELDS)


def test_a_field_the_run_did_not_evaluate_and_a_checkpoint_listed_twice_are_refused(tmp_path):
    regime = _release_tree(tmp_path)
    with pytest.raises(ValueError, match=r"SimNPO: field 'phone' is not one the run evaluated \(email\)"):
        read_checkpoints([regime], ["email"])
    with pytest.raises(ValueError, match=r"GradDiff_OracleGrad: listed twice"):
        read_checkpoints([regime, regime / "unlearned_models"], FIELDS)


def test_a_yaml_list_reads_relative_paths_and_takes_method_and_field_from_the_manifest(tmp_path):
    _checkpoint(tmp_path / "ckpts" / "a", {"method": "grad_diff", "config": {"field": "email"}})
    _checkpoint(tmp_path / "ckpts" / "b")
    listing = tmp_path / "ckpts" / "pool.yaml"
    listing.write_text("- path: a\n- {path: b, method: my_method, field: Phone_Number}\n")
    models, skipped = read_checkpoints([listing], FIELDS)
    assert [(m.method, m.field) for m in models] == [("grad_diff", "email"), ("my_method", "phone")]
    assert models[0].path == tmp_path / "ckpts" / "a" and models[0].origin == str(listing) and skipped == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{path: a}\n", r"expected a non-empty YAML list"),
        ("[]\n", r"expected a non-empty YAML list"),
        ("- [a]\n", r"item 0: expected a mapping with `path`"),
        ("- {path: a, methd: x}\n", r"item 0: unknown key 'methd'"),
        ("- {path: missing, method: x, field: email}\n", r"item 0: path .*missing: no config.json"),
        ("- {path: b}\n", r"item 0: `method` not given and .*b/unlearn_manifest.json does not name it"),
        ("- {path: b, method: x, field: shoe}\n", r"item 0: field 'shoe': not a LACUNA field"),
        ("- {path: a\n", r"not YAML"),
    ],
)
def test_a_bad_yaml_list_is_refused_naming_the_file_and_item(tmp_path, text, message):
    _checkpoint(tmp_path / "a")
    _checkpoint(tmp_path / "b")
    listing = tmp_path / "pool.yaml"
    listing.write_text(text)
    with pytest.raises((ValueError, FileNotFoundError), match=message) as info:
        read_checkpoints([listing], FIELDS)
    assert str(listing) in str(info.value) and "\n" not in str(info.value)


def test_one_lacuna_unlearn_checkpoint_needs_its_manifest_to_name_method_and_field(tmp_path):
    named = _checkpoint(tmp_path / "named", {"method": "rmu", "config": {"field": "phone"}})
    models, _ = read_checkpoints([named], FIELDS)
    assert [(m.method, m.field) for m in models] == [("rmu", "phone")]
    bare = _checkpoint(tmp_path / "bare")
    with pytest.raises(ValueError, match=r"bare: a checkpoint whose unlearn_manifest.json names no method"):
        read_checkpoints([bare], FIELDS)


def _schedule(root: Path, steps: list[int]) -> Path:
    end = _checkpoint(root / "end" / "model")
    for step in steps:
        _checkpoint(end / "snapshots" / f"step-{step:06d}")
    return end


def test_other_stopping_points_are_the_end_of_the_schedule_and_each_trajectory_snapshot(tmp_path):
    end = _schedule(tmp_path, [10, 20])
    entry = {
        "model": str(tmp_path / "chosen" / "model"),
        "end_of_schedule": {"model": str(end), "steps": 20},
        "trajectory": {"points": [{"step": 10}, {"step": 20}]},
    }
    assert other_points(entry, "grad_diff", "email", 42, ("chosen",)) == []
    ends = other_points(entry, "grad_diff", "email", 42, ("chosen", "end"))
    assert [(m.path, m.point, m.seed) for m in ends] == [(end, "end", 42)]
    snaps = other_points(entry, "grad_diff", "email", 42, ("chosen", "snapshots"))
    assert [(m.path.name, m.point) for m in snaps] == [("step-000010", "step 10"), ("step-000020", "step 20")]
    # without stopping the chosen model is the end of the schedule: its snapshots are its own, no "end" row
    plain = {"model": str(end), "trajectory": entry["trajectory"]}
    assert other_points(plain, "rmu", "email", 42, ("chosen", "end")) == []
    assert len(other_points(plain, "rmu", "email", 42, ("chosen", "snapshots"))) == 2
    entry["trajectory"]["points"].append({"step": 30})
    with pytest.raises(FileNotFoundError, match=r"snapshot at step 30 is gone"):
        other_points(entry, "grad_diff", "email", 42, ("chosen", "snapshots"))


@pytest.mark.parametrize("points", [(), ("end",), ("chosen", "chosen"), ("chosen", "final")])
def test_points_other_than_distinct_known_values_with_chosen_are_refused(points):
    with pytest.raises(ValueError, match=r"meta.points: distinct values of chosen,end,snapshots"):
        MetaSettings(points=points)
    with pytest.raises(ValueError, match=r"--points"):
        check_points(points, "--points")
    assert check_points(["chosen", "snapshots"], "--points") == ("chosen", "snapshots")


def test_the_headline_outcome_must_be_an_outcome_of_the_pool():
    assert MetaSettings(headline="leak_relearned_forget").headline == "leak_relearned_forget"
    with pytest.raises(ValueError, match=r"meta.headline: one of leak_relearned_retain, .* got 'leak'"):
        MetaSettings(headline="leak")
