"""``trainer.args.report_to`` reaches the HF Trainer (issue 36 item 6): none by default, a named integration that is
not installed refused before anything loads naming its pip package, ``all`` limited to integrations that write only
local files, and TensorBoard's event files kept with the model when TensorBoard is installed."""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
from helpers.architectures import _unlearn, make_arch, make_world

from lacuna_unlearn.trainer.reporting import INTEGRATIONS, LOCAL_INTEGRATIONS, resolve_report_to

_TENSORBOARD = any(importlib.util.find_spec(m) is not None for m in ("tensorboard", "tensorboardX"))


def _missing() -> str:
    """A network integration whose package is not installed here (skip if all are)."""
    for name in ("wandb", "trackio", "comet_ml", "neptune", "swanlab", "clearml"):
        if importlib.util.find_spec(name) is None:
            return name
    pytest.skip("every candidate integration is installed")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("reporting"))


@pytest.mark.parametrize("value", ["none", None, [], ["none"]])
def test_none_reports_nowhere(value):
    assert resolve_report_to(value) == []


def test_all_never_enables_a_network_integration():
    assert set(LOCAL_INTEGRATIONS) == {"tensorboard"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = resolve_report_to("all")
    assert report == (["tensorboard"] if _TENSORBOARD else [])
    assert resolve_report_to(["all"]) == report
    if not _TENSORBOARD:
        assert any("nothing is reported" in str(w.message) for w in caught)


def test_a_named_integration_that_is_not_installed_names_its_pip_package():
    name = _missing()
    with pytest.raises(ValueError, match=rf"^trainer.args.report_to: {name} is not installed \(pip install "):
        resolve_report_to(name)
    with pytest.raises(ValueError, match=rf"{name} is not installed \(pip install {INTEGRATIONS[name][1]}\)"):
        resolve_report_to(["tensorboard", name] if _TENSORBOARD else [name])


@pytest.mark.parametrize(
    "value,named",
    [
        ("tensorbored", "'tensorbored' is not a reporting integration; choose from"),
        (["none", "tensorboard"], "'none' cannot be combined"),
        (["tensorboard", "all"], "'all' cannot be combined"),
        (3, "must be a name or a list of names"),
    ],
)
def test_bad_report_to_names_the_key(value, named):
    with pytest.raises(ValueError, match=f"trainer.args.report_to.*{named}"):
        resolve_report_to(value)


def test_logging_dir_needs_tensorboard():
    with pytest.raises(ValueError, match="trainer.args.logging_dir='tb' is where TensorBoard writes"):
        resolve_report_to("none", "tb")


def test_the_cli_refuses_a_missing_integration_before_loading_anything(world, tmp_path):
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.trainer.app import preflight

    name = _missing()
    model = tmp_path / "unused_model"
    model.mkdir()
    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(
            config_name="unlearn",
            overrides=[f"model={model}", f"data={world.data_dir}", "output_dir=o", f"trainer.args.report_to={name}"],
        )
    with pytest.raises(ValueError, match=f"trainer.args.report_to: {name} is not installed"):
        preflight(cfg)


def test_by_default_a_run_reports_nowhere_and_names_its_run(world, tmp_path):
    arch = make_arch("llama", world)
    out = _unlearn(world, arch, tmp_path / "simnpo_email", "method=grad_diff")
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["reporting"] == {"report_to": [], "logging_dir": None, "run_name": "simnpo_email"}
    assert manifest["train"]["report_to"] == "none" and not (out / "logs").exists()


@pytest.mark.skipif(not _TENSORBOARD, reason="tensorboard (or tensorboardX) is not installed")
def test_tensorboard_event_files_are_kept_with_the_model(world, tmp_path):
    arch = make_arch("llama", world)
    out = _unlearn(
        world, arch, tmp_path / "tb", "method=grad_diff", "trainer.args.report_to=tensorboard",
        "trainer.args.max_steps=2", "trainer.args.eval_every=1", "trainer.args.best_by=eval_loss",
    )  # fmt: skip
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["reporting"]["report_to"] == ["tensorboard"] and manifest["reporting"]["logging_dir"] == str(
        out / "logs"
    )
    events = b"".join(p.read_bytes() for p in (out / "logs").rglob("events.out.tfevents.*"))
    assert b"train/loss" in events and b"eval/loss" in events  # the steps' losses and the evaluations' values
    elsewhere = tmp_path / "runs" / "tb"
    out = _unlearn(
        world, arch, tmp_path / "tb2", "method=grad_diff", "trainer.args.report_to=[tensorboard]",
        f"trainer.args.logging_dir={elsewhere}",
    )  # fmt: skip
    assert json.loads((out / "unlearn_manifest.json").read_text())["reporting"]["logging_dir"] == str(elsewhere)
    assert list(elsewhere.rglob("events.out.tfevents.*")) and not (out / "logs").exists()
