"""Evaluation every N optimizer steps on the validation people, keeping the best checkpoint by a named criterion
(issue 36 item 6; OpenUnlearning #187): the rule, the checks before anything loads, and real runs on tiny models whose
saved weights are compared with the snapshot of the chosen step."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.architectures import Arch, _unlearn, make_arch, make_world
from helpers.tiny_lm import train_memorizing_lm
from safetensors.torch import load_file

from lacuna_tasks import load_data
from lacuna_tasks.prompts import qa_prompt
from lacuna_unlearn.trainer.selection import best_step, check_evaluation, validation_rows


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("best_checkpoint"))


def _weights(model_dir) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)


def _snapshot(out, step: int) -> dict[str, torch.Tensor]:
    return _weights(out / "snapshots" / f"step-{step:06d}")


def test_best_step_is_the_lowest_and_the_earliest_of_equals():
    curve = [{"step": 4, "m": 0.5}, {"step": 2, "m": 0.0}, {"step": 6, "m": 0.0}, {"step": 8, "m": None}]
    assert best_step(curve, "m") == {"step": 2, "value": 0.0}
    assert best_step([{"step": 1, "m": math.nan}, {"step": 2, "m": 3.0}], "m") == {"step": 2, "value": 3.0}
    assert best_step([{"step": 1, "m": math.nan}, {"step": 2, "m": math.nan}], "m")["step"] == 1
    with pytest.raises(ValueError, match="trainer.args.best_by=m"):
        best_step([{"step": 1}], "m")


@pytest.mark.parametrize(
    "every,best_by,named",
    [
        (-1, "validation_leak", "trainer.args.eval_every"),
        (True, "validation_leak", "trainer.args.eval_every"),
        (2, "forget_quality", "trainer.args.best_by must be one of"),
        (2, None, "trainer.args.best_by"),
    ],
)
def test_bad_evaluation_settings_name_the_key(every, best_by, named):
    with pytest.raises(ValueError, match=named):
        check_evaluation(every, best_by)


def test_a_criterion_without_validation_people_is_refused(world, tmp_path):
    import shutil

    data = load_data(world.data_dir)
    assert len(validation_rows(data, "email", "eval_loss")) == len(
        [r for r in data.splits["validation"] if r["field"] == "Email Address"]
    )
    with pytest.raises(
        ValueError, match=r"trainer.args.best_by=validation_leak needs validation people of field=phone"
    ):
        validation_rows(data, "phone", "validation_leak")  # LACUNA gives validation people to two fields only
    bare = tmp_path / "no_validation"
    shutil.copytree(world.data_dir, bare)
    (bare / "validation.jsonl").unlink()
    with pytest.raises(ValueError, match="trainer.args.best_by=eval_loss needs validation people, and .* has no"):
        validation_rows(load_data(bare), "email", "eval_loss")


def _compose(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        return compose(config_name="unlearn", overrides=list(overrides))


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["field=phone", "trainer.args.eval_every=5"], "trainer.args.best_by=validation_leak needs validation people"),
        (["trainer.args.eval_every=5", "trainer.args.best_by=rouge"], "trainer.args.best_by must be one of"),
        (["trainer.args.eval_every=-2"], "trainer.args.eval_every must be an optimizer step count"),
        (["trainer.args.eval_every=2.5"], "trainer.args.eval_every: expected an integer"),
        (["trainer.args.eval_every=5", "method=frp"], "trainer.args.eval_every: method=frp edits weights directly"),
        (["trainer.args.eval_every=5", "attack=relearn"], "trainer.args.eval_every: attack=relearn already keeps"),
    ],
)
def test_the_cli_refuses_an_evaluation_it_cannot_run_before_loading_anything(world, tmp_path, overrides, named):
    from lacuna_unlearn.trainer.app import preflight

    model = tmp_path / "unused_model"
    model.mkdir()
    cfg = _compose(f"model={model}", f"data={world.data_dir}", f"output_dir={tmp_path / 'out'}", *overrides)
    with pytest.raises(ValueError, match=named):
        preflight(cfg)
    assert not (tmp_path / "out").exists()


def test_eval_loss_keeps_the_best_step_not_the_last(world, tmp_path, forget_nll):
    """Gradient ascent on the forget people raises the validation people's loss too: the best step by ``eval_loss``
    is an early one, and the saved model is that step's weights (compared with its snapshot), not the last step's."""
    arch = make_arch("llama", world)
    out = _unlearn(
        world, arch, tmp_path / "out", "method=grad_ascent", "trainer.args.max_steps=4", "trainer.args.eval_every=1",
        "trainer.args.best_by=eval_loss", "trainer.args.snapshot_steps=[1,2,3,4]",
        "trainer.args.max_length=256",  # forget_nll's encoding: no prompt cut short
    )  # fmt: skip
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["final_log"]["step"] == 4  # evaluating every step does not swallow the steps' own loss logs
    best = manifest["best_checkpoint"]
    rows = validation_rows(load_data(world.data_dir), "email", "eval_loss")
    assert best["criterion"] == "eval_loss" and best["every"] == 1 and best["rows"] == len(rows)
    assert [p["step"] for p in best["curve"]] == [1, 2, 3, 4] and best["final_step"] == 4
    values = {p["step"]: p["eval_loss"] for p in best["curve"]}
    for step, value in values.items():  # the recorded value is the snapshot's answer NLL, measured apart
        assert value == pytest.approx(forget_nll(out / "snapshots" / f"step-{step:06d}", rows), abs=1e-4)
    lowest = min(values.values())
    assert best["chosen_step"] == min(s for s, v in values.items() if v == lowest) and best["value"] == lowest
    assert best["chosen_step"] < 4  # the loss rose: an earlier step is kept
    saved = _weights(out)
    assert _same(saved, _snapshot(out, best["chosen_step"])) and not _same(saved, _snapshot(out, 4))


def test_validation_leak_picks_the_first_step_where_the_validation_people_stop_leaking(world, tmp_path, leak_and_nll):
    """A model that memorized the validation people unlearns them (``forget_split=validation``, the validation run of
    ``lacuna run``'s stopping points in one process): the leak falls to 0 and stays there; the earliest step at 0 is
    kept, and the saved model leaks as recorded."""
    data = load_data(world.data_dir)
    rows = validation_rows(data, "email", "validation_leak")
    texts = [qa_prompt(r["question"]) + r["answer"] + "\n" for r in rows]
    model = train_memorizing_lm(texts, world.tokenizer, tmp_path / "memorized", steps=150)
    assert leak_and_nll(model, rows)[0] >= 0.5  # the model knows the validation people before unlearning
    arch = Arch("llama", None, model, None)
    out = _unlearn(
        world, arch, tmp_path / "out", "method=grad_ascent", "forget_split=validation", "trainer.args.max_steps=6",
        "trainer.args.eval_every=1", "trainer.args.snapshot_steps=[1,2,3,4,5,6]",
    )  # fmt: skip
    best = json.loads((out / "unlearn_manifest.json").read_text())["best_checkpoint"]
    assert best["criterion"] == "validation_leak" and best["people"] == len({r["ID"] for r in rows})
    values = {p["step"]: p["validation_leak"] for p in best["curve"]}
    assert sorted(values) == [1, 2, 3, 4, 5, 6] and min(values.values()) == 0.0 and values[6] == 0.0
    assert best["chosen_step"] == min(s for s, v in values.items() if v == 0.0)  # ties: the earliest
    for step in (1, best["chosen_step"]):  # the recorded leak is the snapshot's, measured apart
        assert leak_and_nll(out / "snapshots" / f"step-{step:06d}", rows)[0] == values[step]
    assert _same(_weights(out), _snapshot(out, best["chosen_step"]))


def test_no_evaluation_by_default(world, tmp_path):
    arch = make_arch("gpt2", world)
    out = _unlearn(world, arch, tmp_path / "out", "method=grad_diff")
    assert json.loads((out / "unlearn_manifest.json").read_text())["best_checkpoint"] is None


def test_under_lora_the_kept_step_is_merged(world, tmp_path):
    """Under LoRA only the adapters train, so only they are kept and restored; the saved (merged) model is the chosen
    step's, as its merged snapshot."""
    arch = make_arch("gpt2", world)
    out = _unlearn(
        world, arch, tmp_path / "out", "method=grad_ascent", "lora.enabled=true", "lora.r=2",
        "trainer.args.max_steps=3", "trainer.args.eval_every=1", "trainer.args.best_by=eval_loss", "trainer.args.snapshot_steps=[1,2,3]",
    )  # fmt: skip
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    best = manifest["best_checkpoint"]
    assert [p["step"] for p in best["curve"]] == [1, 2, 3] and manifest["lora_adapters"]["b_moved"] > 0
    assert _same(_weights(out), _snapshot(out, best["chosen_step"]))
    if best["chosen_step"] != 3:
        assert not _same(_weights(out), _snapshot(out, 3))
