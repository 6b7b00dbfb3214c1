"""Snapshots dense where a forget leak falls, and a run stopped at a chosen step on the full schedule's learning
rates (issue 35 item 4): the trainer side of stopping points chosen on validation people."""

from __future__ import annotations

import json

import pytest
from helpers.architectures import _unlearn, make_arch, make_world

from lacuna_unlearn.trainer.loop import snapshot_steps


def test_snapshot_steps_linear_log_and_extra():
    assert snapshot_steps(60, 6) == [10, 20, 30, 40, 50, 60]
    log = snapshot_steps(60, 6, "log")
    assert log[0] <= 2 and log[-1] == 60 and log == sorted(set(log))
    assert sum(s <= 10 for s in log) >= 3  # dense early: half the points in the first sixth of the schedule
    assert snapshot_steps(60, 0, extra=[7, 0, 61, 7]) == [7]  # outside the schedule: dropped
    assert snapshot_steps(1, 4, "log") == [1]
    with pytest.raises(ValueError, match="snapshot_spacing"):
        snapshot_steps(60, 6, "cubic")


def test_a_run_stops_at_the_chosen_step_and_keeps_the_asked_snapshots(tmp_path):
    world = make_world(tmp_path / "world")
    arch = make_arch("llama", world)
    out = _unlearn(
        world, arch, tmp_path / "out", "method=grad_diff", "trainer.args.max_steps=6", "trainer.args.stop_at_step=3",
        "trainer.args.snapshots=3", "trainer.args.snapshot_spacing=log", "trainer.args.snapshot_steps=[2]",
    )  # fmt: skip
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "snapshots").glob("step-*"))
    assert steps == [2, 3]  # log over 6 steps: 2, 3, 6 (2 also asked); 6 never reached: stopped at 3
    text = json.dumps(manifest)
    assert '"stop_at_step": 3' in text
    with pytest.raises(ValueError, match="snapshot_steps"):
        _unlearn(world, arch, tmp_path / "bad", "method=grad_diff", "trainer.args.snapshot_steps=[0]")


def test_choose_step_first_below_threshold_with_its_bracket():
    from lacuna_unlearn.bench.stopping import choose_step

    curve = [{"step": 1, "j_w": 1.0}, {"step": 4, "j_w": 0.6}, {"step": 13, "j_w": 0.0}, {"step": 60, "j_w": 0.0}]
    assert choose_step(curve, "j_w", 0.1) == {"step": 13, "previous": 4, "reached": True}
    assert choose_step([{"step": 1, "j_w": 0.1}], "j_w", 0.1) == {"step": 1, "previous": 0, "reached": True}
    never = choose_step([{"step": 1, "j_w": 1.0}, {"step": 60, "j_w": 0.4}], "j_w", 0.1)
    assert never == {"step": 60, "previous": 60, "reached": False}  # the end of the schedule, said so
    with pytest.raises(ValueError, match="no snapshot"):
        choose_step([{"step": 1, "j_w": None}], "j_w", 0.1)


def test_a_stopping_rule_on_a_metric_the_run_does_not_compute_is_refused():
    from lacuna_unlearn.bench.run_config import load_run_config

    with pytest.raises(ValueError, match="stopping.metric=j_w needs the forget_worstcase task"):
        load_run_config(preset="smoke", overrides={"stopping.metric": "j_w"})
    with pytest.raises(ValueError, match="stopping.metric must be one of"):
        load_run_config(preset="mini", overrides={"stopping.metric": "retain_accuracy"})
    with pytest.raises(ValueError, match="stopping.threshold"):
        load_run_config(preset="mini", overrides={"stopping.threshold": 1.5})
    assert load_run_config(preset="smoke", overrides={"stopping.enabled": False, "stopping.metric": "j_w"})
