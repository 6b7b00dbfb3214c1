"""The validation view of the stopping points (lacuna_unlearn/bench/stopping.py): the validation people become the
forget split, the retain side loses their groups and gains the held-out retain people, on lacuna-bench's data and on
the LACUNA release's data-<regime>/ alike."""

from __future__ import annotations

from lacuna_tasks import load_data
from lacuna_unlearn.bench.stages import Stages
from lacuna_unlearn.bench.stopping import validation_view


def _check(view_dir, source) -> None:
    data, view = load_data(source), load_data(view_dir)
    groups = {r["group_id"] for r in data.splits["validation"]}
    assert view.splits["forget"] == data.splits["validation"]
    assert "validation" not in view.splits and "forget_paraphrased" not in view.splits
    expected = [r for s in ("retain", "retain_eval") for r in data.splits.get(s, []) if r["group_id"] not in groups]
    assert view.splits["retain"] == expected
    assert view.splits["relearn"] == data.splits["relearn"]
    forget_ids = {r["ID"] for r in view.splits["forget"]}
    assert forget_ids.isdisjoint({r["ID"] for r in view.splits["retain"]})


def test_validation_view_of_testbed_data(tiny_lacuna, tmp_path):
    stages = Stages(tmp_path / "stages", lambda line: None)
    view = validation_view(stages, {"data": tiny_lacuna.data_dir, "tb_key": "t"})
    _check(view, tiny_lacuna.data_dir)
    assert (view / "profiles.jsonl").is_file() == (tiny_lacuna.data_dir / "profiles.jsonl").is_file()


def test_validation_view_of_release_data(tiny_release, tmp_path):
    source = tiny_release.size_dir / "data-masked"
    stages = Stages(tmp_path / "stages", lambda line: None)
    view = validation_view(stages, {"data": source, "tb_key": "r"})
    _check(view, source)
    assert not list(view.glob("*.parquet")) and not (view / "README.md").exists()
