"""The one configuration system (issue 21): dataclass defaults, preset YAMLs, one ``key=value`` grammar, CLI
defaults and choices derived from their homes, ``-v``/``-q``. ``lacuna demo`` as ``lacuna run --preset demo`` on the
smoke testbed: tests/e2e/test_demo_run.py.
"""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from helpers import HELPERS

from lacuna_unlearn.dataclass_config import config_choices, parse_overrides, preset_names

#: Every preset as the hand-written dicts/dataclasses of the previous release returned it (captured before the
#: presets became YAML files), updated only where a preset changed on purpose (testbed mini: training-only question
#: forms and two-pair QA documents, issue 19; run score: the null calibration's settings, issue 34; regime: the
#: paper's rule and tau_ppl, issue 35; run mini: every field by default, issue 35 item 5; CHANGELOG).
SNAPSHOT = json.loads((HELPERS / "config_presets_snapshot.json").read_text())


def test_run_presets_equal_the_previous_release():
    from lacuna_unlearn.bench.run_config import PRESETS, load_run_config

    assert set(SNAPSHOT["run"]) <= set(PRESETS)
    for name, before in SNAPSHOT["run"].items():
        now = load_run_config(preset=name)
        if name == "smoke":  # the old dict left neutral_ppl out (read as falsy); the YAML says false
            assert now["eval"].pop("neutral_ppl") is False
        assert json.dumps(now, sort_keys=True) == json.dumps(before, sort_keys=True), name
        assert list(now) == list(before), name  # same keys, same order
    assert PRESETS["mini"]["methods"] == PRESETS["smoke"]["methods"]


def test_testbed_presets_equal_the_previous_release():
    from lacuna_unlearn.testbed.presets import PRESETS, get_preset

    assert sorted(PRESETS) == sorted(SNAPSHOT["testbed"]) == preset_names("testbed")
    for name, before in SNAPSHOT["testbed"].items():
        assert json.dumps(get_preset(name).to_dict()) == json.dumps(before), name  # values and types (0.0 vs 0)


def test_presets_hold_only_what_differs_from_the_dataclass_defaults():
    import yaml

    from lacuna_unlearn.bench.run_config import RunConfig
    from lacuna_unlearn.dataclass_config import PRESET_DIR
    from lacuna_unlearn.testbed.presets import TestbedConfig

    defaults = TestbedConfig(name="x").to_dict()
    for file in (PRESET_DIR / "testbed").glob("*.yaml"):
        for key, value in yaml.safe_load(file.read_text()).items():
            assert key == "notes" or value != defaults[key], (file.name, key)
    assert yaml.safe_load((PRESET_DIR / "run" / "mini.yaml").read_text()) == {}  # mini = the RunConfig defaults
    assert RunConfig().preset == "mini"


def test_override_grammar_is_hydras_and_reads_json():
    assert parse_overrides(["attack.attempts=50", "fields=[email,phone]", "score.frag=false", "x=1e-3", "n=null"]) == {
        "attack.attempts": 50, "fields": ["email", "phone"], "score.frag": False, "x": 1e-3, "n": None,
    }  # fmt: skip
    assert parse_overrides(['fields=["email"]', 'm={"grad_diff": []}']) == {"fields": ["email"], "m": {"grad_diff": []}}
    assert parse_overrides(["methods.rmu=['method.args.alpha=10']"]) == {"methods.rmu": ["method.args.alpha=10"]}
    assert parse_overrides(["s=yes", "t=abc"]) == {"s": "yes", "t": "abc"}  # strings stay strings
    for bad, named in [("noequals", "noequals"), ("a=1,2", "sweep"), ("+a=1", r"\+a=1"), ("m=[a.b=1]", "quote")]:
        with pytest.raises(ValueError, match=named):
            parse_overrides([bad])


def test_overrides_and_files_are_typed_strictly():
    from lacuna_unlearn.bench.run_config import load_run_config

    cfg = load_run_config(
        preset="smoke", overrides=parse_overrides(["reversibility.learning_rate=1", "methods.rmu=['a=1']"])
    )
    rate = cfg["reversibility"]["learning_rate"]
    assert rate == 1.0 and isinstance(rate, float)  # an integer literal for a float setting is a float
    assert cfg["methods"]["rmu"] == ["a=1"] and len(cfg["methods"]) == 9  # one entry set, the rest kept
    cfg = load_run_config(preset="smoke", overrides={"methods": {"grad_diff": []}, "fields": "all"})
    assert cfg["methods"] == {"grad_diff": []} and len(cfg["fields"]) == 4  # a map replaces the whole map
    for override, message in [
        ({"attack.attempts": "50"}, r"attack.attempts: expected an integer, got '50'"),
        ({"eval.tasks": "forget_qa"}, r"eval.tasks: expected a list of strings"),
        ({"eval.batch_size": None}, r"eval.batch_size: got null, expected an integer"),
        ({"preset": "huge"}, r"preset 'huge' is not a testbed preset"),
        ({"eval.batch_size.x": 1}, r"'batch_size' is not a section"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_run_config(preset="smoke", overrides=override)


def test_config_schemas_are_hydra_structured_configs():
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from lacuna_unlearn.bench.run_config import RunConfig, load_run_config
    from lacuna_unlearn.testbed.presets import get_preset

    load_run_config(preset="smoke")
    get_preset("smoke")
    store = ConfigStore.instance()
    assert {"run.yaml", "testbed.yaml"} <= set(store.list("lacuna"))
    run = store.load("lacuna/run.yaml").node
    assert OmegaConf.get_type(run) is RunConfig and run.attack.attempts == RunConfig().attack.attempts


def test_cli_choices_and_defaults_come_from_their_homes():
    from lacuna_tasks.normalize import JUDGES
    from lacuna_tasks.schema import FIELDS
    from lacuna_unlearn.bench.cli.main import _leaves, build_parser
    from lacuna_unlearn.bench.run_config import AttackConfig, RegimeConfig

    parser = build_parser()
    commands = {leaf.prog.removeprefix("lacuna "): leaf for leaf in _leaves(parser)}

    def option(command: str, flag: str) -> argparse.Action:
        return next(a for a in commands[command]._actions if flag in a.option_strings)

    assert option("run", "--preset").choices == preset_names("run") and "demo" in preset_names("run")
    assert option("build-testbed", "--preset").choices == preset_names("testbed")
    assert option("demo", "--preset").choices == preset_names("testbed")
    for command in ("attack", "reversibility", "demo"):
        assert option(command, "--field").choices == list(FIELDS)
    assert option("attack", "--judge").choices == list(JUDGES)
    assert option("attack", "--protocol").choices == config_choices("attack")
    assert option("attack", "--attempts").default == AttackConfig().attempts
    assert option("reversibility", "--tau-rev").default == RegimeConfig().tau_rev
    assert all(option(name, "--verbose") and option(name, "--quiet") for name in commands)  # -v/-q everywhere
    assert set(commands) >= {"tasks path", "data generate", "build-testbed", "demo", "run", "score", "attack", "gate"}


def test_score_help_shows_the_scorers_defaults(capsys):
    from lacuna_metrics.localization.precision import LocalizationConfig
    from lacuna_unlearn.bench.cli.main import main

    with pytest.raises(SystemExit):
        main(["score", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"({LocalizationConfig().composite_samples})" in out and f"({LocalizationConfig().exact_limit})" in out


@pytest.mark.parametrize(("flags", "info", "debug"), [([], True, False), (["-q"], False, False), (["-v"], True, True)])
def test_verbosity_flags_set_the_log_level(flags, info, debug):
    from lacuna_unlearn.bench.cli.main import main

    assert main(["tasks", "path", *flags]) == 0
    logger = logging.getLogger("lacuna_unlearn.bench.run")
    assert logger.isEnabledFor(logging.INFO) is info and logger.isEnabledFor(logging.DEBUG) is debug
    main(["tasks", "path"])  # back to the default for the other tests


def test_testbed_preset_is_read_from_the_testbed_manifest(tmp_path):
    """What results.json's ``preset`` reports for a given testbed; a malformed manifest is named in the error."""
    from lacuna_unlearn.bench.stages import testbed_preset

    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "lacuna-bench-testbed", "preset": "lacuna"}))
    assert testbed_preset(tmp_path) == "lacuna"
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "lacuna-bench-testbed"}))
    assert testbed_preset(tmp_path) is None
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"manifest\.json: not a readable testbed manifest"):
        testbed_preset(tmp_path)


@pytest.mark.parametrize(
    ("key", "value"),
    [("score.null_tolerance", 0), ("score.null_tolerance", 0.5), ("regime.tau_rev", 0), ("regime.tau_cat", 1.0)],
)
def test_settings_whose_ends_are_degenerate_are_refused_up_front(key, value):
    """score.null_tolerance 0 or 0.5 was accepted by the run config and refused only later by the scorer, under a
    flag the user never typed; tau 0 or 1 labels everything alike (issue 37 item 5)."""
    from lacuna_unlearn.bench.run_config import load_run_config

    with pytest.raises(ValueError, match=rf"run config: {key} must be in \("):
        load_run_config(None, preset="mini", overrides={key: value})


@pytest.mark.parametrize(("flag", "value"), [("--tau-rev", "5"), ("--tau-cat", "-1"), ("--tau-rev", "0")])
def test_reversibility_thresholds_outside_zero_one_are_refused(flag, value, capsys):
    from lacuna_unlearn.bench.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["reversibility", "--original", "a", "--unlearned", "b", "--relearned", "c", f"{flag}={value}"])
    assert exc.value.code == 2 and "is outside (0.0, 1.0)" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["/tmp/tbü/model", "/data/my runs/it's", "C:\\models\\x", "/odd\\", "a\\'b", "/plain"])
def test_a_path_override_reaches_hydra_as_the_string_it_is(path):
    """Non-ASCII paths broke `lacuna run` and `lacuna attack` (issue 37): Hydra's grammar refuses them unquoted."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lacuna_unlearn.dataclass_config import parse_overrides, path_override

    assert OverridesParser.create().parse_override(path_override("testbed", path)).value() == path
    if path.isascii() is False:
        assert parse_overrides([f"testbed={path}"]) == {"testbed": path}  # --set testbed=/tmp/tbü
