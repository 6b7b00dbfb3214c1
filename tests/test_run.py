"""`lacuna run` end to end on the smoke testbed: results.json schema, report, plots, stage cache, bad configs."""

from __future__ import annotations

import json

import pytest

from lacuna_unlearn.run import PRESETS, load_run_config, run_benchmark

#: Cheap settings per method: the preset's own overrides, then fewer steps (training-free editors get fewer
#: value-optimisation steps instead).
_CHEAP = {"alpha_edit": ["method.args.v_num_grad_steps=5"], "frp": []}


def _cheap(name: str, extra: list[str]) -> list[str]:
    return [*extra, *_CHEAP.get(name, ["trainer.args.max_steps=3"])]


def _config(testbed):
    return load_run_config(
        preset="smoke",
        overrides={
            "testbed": str(testbed),
            "methods": {name: _cheap(name, PRESETS["smoke"]["methods"][name]) for name in ("grad_diff", "oracle_grad")},
            "score.composite_samples": 0,
            "attack.attempts": 2,
            "attack.overrides": ["trainer.args.max_steps=2", "eval_fraction=0"],
        },
    )


def test_every_preset_runs_the_same_method_list():
    """The test below runs the smoke preset's full method list; mini's is the same list with the same
    overrides (it differs only in the shared schedule, which the tests replace by a few steps)."""
    assert PRESETS["smoke"]["methods"] == PRESETS["mini"]["methods"]
    assert set(PRESETS) == {"mini", "smoke"}


def test_every_default_method_runs_unlearn_evaluate_and_score(smoke_testbed, tmp_path):
    """The preset's full default list (reduced steps) through unlearning, evaluation and scoring; the attack stage
    is the same fine-tune for every method and runs in the end-to-end test below."""
    cfg = load_run_config(
        preset="smoke",
        overrides={
            "testbed": str(smoke_testbed),
            "methods": {name: _cheap(name, extra) for name, extra in PRESETS["smoke"]["methods"].items()},
            "eval.tasks": ["forget_qa"],
            "score.composite_samples": 0,
            "score.frag": False,
            "attack.enabled": False,
        },
    )
    results = run_benchmark(tmp_path / "run", cfg, log=lambda line: None)
    assert list(results["methods"]) == list(PRESETS["smoke"]["methods"]) and len(results["methods"]) == 9
    for name, method in results["methods"].items():
        assert method["behaviour"]["forget_leak"] is not None, name
        assert 0.0 <= method["auc"]["forget"]["best"]["value"] <= 1.0, name
        assert method["checkpoint"]["fingerprint"] == method["score_checkpoint"]["fingerprint"], name


def test_run_writes_schema_report_and_plots_then_caches(smoke_testbed, tmp_path):
    logs: list[str] = []
    results = run_benchmark(tmp_path / "run", _config(smoke_testbed), log=logs.append)
    assert results["schema"] == {"name": "lacuna-bench/run", "version": 1}
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["methods"].keys() == {"grad_diff", "oracle_grad"}
    for name, method in on_disk["methods"].items():
        for target in ("forget", "unified", "forget_vs_retain"):
            best = method["auc"][target]["best"]
            assert set(best) == {"score", "value"} and 0.0 <= best["value"] <= 1.0, (name, target)
        assert set(method["behaviour"]) >= {"forget_leak", "retain_accuracy", "em", "es", "prob"}
        assert isinstance(method["frag"], float) and method["l2"] >= 0
        assert set(method["attack"]) >= {"success_at_n_unlearned", "success_at_n_relearned"}
        assert method["regime"]["regime"]
    assert on_disk["methods"]["oracle_grad"]["auc"]["forget"]["best"]["value"] > 0.99  # restricted to the mask
    assert on_disk["baseline"]["auc"]["forget"]["before_magnitude"] is not None
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| oracle_grad |" in report and "trivial detector" in report and "## Reading this table" in report
    assert {p.name for p in (tmp_path / "run" / "plots").glob("*.png")} == {"auc.png", "layers.png", "relearning.png"}
    assert any("running" in line for line in logs)

    from lacuna_unlearn.cli import main

    results_file = str(tmp_path / "run" / "results.json")
    junit = tmp_path / "gate.xml"
    assert main(["gate", results_file, "--method", "oracle_grad", "--min-auc", "0.85", "--junit", str(junit)]) == 0
    assert junit.is_file()
    assert main(["gate", results_file, "--min-auc", "1.01"]) == 1
    assert main(["gate", results_file, "--method", "nope", "--min-auc", "0.5"]) == 2

    logs.clear()
    again = run_benchmark(tmp_path / "run", _config(smoke_testbed), log=logs.append)
    assert logs and all("cached" in line for line in logs)  # nothing recomputed
    assert again["methods"] == results["methods"]

    changed = _config(smoke_testbed)
    changed["methods"]["grad_diff"] = ["trainer.args.max_steps=4"]
    logs.clear()
    run_benchmark(tmp_path / "run", changed, log=logs.append)
    rerun = [line for line in logs if "running" in line]
    assert rerun and all("grad_diff" in line for line in rerun)  # only the changed method's stages


def test_bad_run_configs_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        load_run_config(overrides={"methods": {"nope": []}})
    with pytest.raises(ValueError, match="fields must be a non-empty list"):
        load_run_config(overrides={"fields": ["shoe_size"]})
    bad = tmp_path / "bad.yaml"
    bad.write_text("methodz: {}\n")
    with pytest.raises(ValueError, match="bad.yaml: unknown run setting 'methodz'"):
        load_run_config(bad)
    bad.write_text("methods: [unclosed\n")
    with pytest.raises(ValueError, match="bad.yaml: cannot read the run config"):
        load_run_config(bad)
    with pytest.raises(ValueError, match="unknown run preset"):
        load_run_config(preset="huge")
