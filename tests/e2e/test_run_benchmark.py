"""`lacuna run` end to end on the smoke testbed: results.json schema, report, plots, stage cache, seeds, fields,
repeatability (presets and bad configs: tests/unlearn/bench/test_run.py).
"""

from __future__ import annotations

import json

import pytest

from lacuna_unlearn.bench.run import PRESETS, load_run_config, run_benchmark

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
            "reversibility.epochs": 1,
            "trajectory.points": 2,
            "stopping.points": 2,
        },
    )


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
            "reversibility.enabled": False,
            "trajectory.enabled": False,
            "stopping.enabled": False,
        },
    )
    results = run_benchmark(tmp_path / "run", cfg, log=lambda line: None)
    assert list(results["methods"]) == list(PRESETS["smoke"]["methods"]) and len(results["methods"]) == 9
    for name, method in results["methods"].items():
        assert method["behaviour"]["forget_leak"] is not None, name
        assert 0.0 <= method["auc"]["forget"]["best"]["value"] <= 1.0, name
        assert method["checkpoint"]["fingerprint"] == method["score_checkpoint"]["fingerprint"], name


def test_seeds_give_mean_and_sd_of_every_metric(smoke_testbed, tmp_path):
    """``seeds: [1, 2]``: each method unlearned once per seed (separate cached stages); results carry the first
    seed's entry plus mean ± sd across seeds, and the report a table of them. A second seed list reuses the stages
    of the seeds it shares."""
    overrides = {
        "testbed": str(smoke_testbed),
        "methods": {"grad_diff": _cheap("grad_diff", [])},
        "eval.tasks": ["forget_qa", "retain_qa"],
        "score.composite_samples": 0,
        "score.frag": False,
        "attack.enabled": False,
        "reversibility.enabled": False,
        "trajectory.enabled": False,
        "seeds": [1, 2],
    }
    logs: list[str] = []
    results = run_benchmark(tmp_path / "run", load_run_config(preset="smoke", overrides=overrides), log=logs.append)
    summary = results["methods"]["grad_diff"]["across_seeds"]
    assert summary["seeds"] == [1, 2]
    leak = summary["metrics"]["behaviour.forget_leak"]
    assert leak["n"] == 2 and len(leak["values"]) == 2 and leak["values"][0] == results["methods"]["grad_diff"][
        "behaviour"]["forget_leak"]  # fmt: skip
    assert leak["mean"] == pytest.approx(sum(leak["values"]) / 2)
    assert summary["metrics"]["auc.forget.best"]["n"] == 2
    assert summary["regimes"] == [None, None]  # the reversibility protocol is off here
    assert sum(line.startswith("[email] unlearn grad_diff (seed 2): running") for line in logs) == 1
    assert "Mean ± sd over 2 unlearning seeds" in (tmp_path / "run" / "report.md").read_text()
    with pytest.raises(ValueError, match="seeds"):
        load_run_config(preset="smoke", overrides={**overrides, "seeds": []})
    with pytest.raises(ValueError, match="seeds"):
        load_run_config(preset="smoke", overrides={**overrides, "seeds": [1, "x"]})


def test_every_field_runs_and_is_reported(smoke_testbed, tmp_path):
    """``fields: all`` runs each of the four fields and the report has a table per field (plots per field too)."""
    cfg = load_run_config(
        preset="smoke",
        overrides={
            "testbed": str(smoke_testbed),
            "fields": "all",
            "methods": {"grad_diff": ["trainer.args.max_steps=1"]},
            "eval.tasks": ["forget_qa", "retain_qa"],
            "score.composite_samples": 0,
            "score.frag": False,
            "attack.enabled": False,
            "reversibility.enabled": False,
            "trajectory.enabled": False,
        },
    )
    assert cfg["fields"] == ["email", "phone", "birth_city", "drivers_license"]
    results = run_benchmark(tmp_path / "run", cfg, log=lambda line: None)
    assert list(results["by_field"]) == cfg["fields"]
    for field, entry in results["by_field"].items():
        assert entry["methods"]["grad_diff"]["behaviour"]["forget_leak"] is not None, field
    report = (tmp_path / "run" / "report.md").read_text()
    assert all(f"## Field `{f}`" in report for f in cfg["fields"])
    plots = {p.name for p in (tmp_path / "run" / "plots").glob("auc*.png")}
    assert plots == {"auc.png", "auc-phone.png", "auc-birth_city.png", "auc-drivers_license.png"}


def test_run_writes_schema_report_and_plots_then_caches(smoke_testbed, tmp_path):
    logs: list[str] = []
    results = run_benchmark(tmp_path / "run", _config(smoke_testbed), log=logs.append)
    assert results["schema"] == {"name": "lacuna-bench/run", "version": 2}
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["methods"].keys() == {"grad_diff", "oracle_grad"}
    for name, method in on_disk["methods"].items():
        for target in ("forget", "unified", "forget_vs_retain"):
            best = method["auc"][target]["best"]
            assert set(best) == {"score", "value"} and 0.0 <= best["value"] <= 1.0, (name, target)
        assert set(method["behaviour"]) >= {"forget_leak", "retain_accuracy", "em", "es", "prob", "n", "ci"}
        ci = method["behaviour"]["ci"]["forget_leak"]  # exact interval over persons
        assert ci["low"] <= method["behaviour"]["forget_leak"] <= ci["high"]
        assert ci["n"] == method["behaviour"]["n"]["forget_leak"] and ci["method"].startswith("clopper_pearson")
        assert ci["k"] == pytest.approx(method["behaviour"]["forget_leak"] * ci["n"])
        assert method["relearned_behaviour"]["n"]["forget_leak"] == method["behaviour"]["n"]["forget_leak"]
        assert isinstance(method["frag"], float) and method["l2"] >= 0
        assert set(method["attack"]) >= {"success_at_n_unlearned", "success_at_n_relearned"}
        traj = method["trajectory"]
        assert [p["step"] for p in traj["points"]] == [2, 3] and traj["end"]["step"] == 3  # max_steps=3, 2 points
        assert all(0.0 <= p["auc_raw"]["forget"] <= 1.0 and p["forget_leak"] is not None for p in traj["points"])
        assert traj["matched"] is None or traj["matched"]["forget_leak"] <= traj["leak_threshold"]
        rev = method["reversibility"]
        assert set(rev["sources"]) == {"forget", "retain", "unrelated"} and rev["budget"] == "forget"
        for source in rev["sources"].values():
            assert source["n"]["forget_leak"] == method["behaviour"]["n"]["forget_leak"]
        assert method["regime"]["regime"]
        stop = method["stopping"]  # chosen on the validation people, never on forget or retain people
        assert stop["metric"] == "forget_leak" and stop["people"] >= 1 and stop["curve"]
        assert 1 <= stop["chosen_step"] <= stop["forget_steps"] == 3
        if stop["chosen_step"] < stop["forget_steps"]:  # the headline is the stopped run; the end is the ablation
            assert method["end_of_schedule"]["steps"] == 3 and "forget_leak" in method["end_of_schedule"]["behaviour"]
    assert on_disk["methods"]["oracle_grad"]["stopping"]["validation_groups"]  # restricted to their own groups
    assert on_disk["methods"]["oracle_grad"]["auc"]["forget"]["best"]["value"] > 0.99  # restricted to the mask
    oracle = on_disk["methods"]["oracle_grad"]["auc"]["forget"]
    assert oracle["calibrated_best"]["value"] > 0.95 and oracle["best_lift"]["value"] > 0.4  # survives calibration
    control = on_disk["by_field"]["email"]["positive_control"]
    assert control["overrides"] == ["restrict='regex:^model\\.layers\\.3\\.'"]  # the smoke model's last layer
    assert isinstance(control["attack_strong_enough"], bool)
    negative = on_disk["by_field"]["email"]["negative_control"]  # learning from scratch at the same budget
    people = on_disk["baseline"]["behaviour"]["n"]["forget_leak"]
    assert negative["people"] == people and negative["relearned"]["n"] == negative["before"]["n"] == people
    assert negative["before"]["forget_leak"] == 0.0  # the testbed's model never saw these people
    if not control["attack_strong_enough"]:  # then no method may be labelled
        assert all(m["regime"]["regime"] == "undetermined" for m in on_disk["methods"].values())
    else:
        assert control["regime"]["reversible"] is True and control["silenced"] >= 0.8
        assert control["separation_from_negative"]["separated"]
        for m in on_disk["methods"].values():  # reversible only beyond learning from scratch
            if m["regime"].get("reversible") is True:
                assert m["regime"]["controls"]["separation_from_negative"]["separated"]
    assert on_disk["baseline"]["auc"]["forget"]["before_magnitude"] is not None
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| oracle_grad |" in report and "trivial detector" in report and "## Reading this table" in report
    assert {p.name for p in (tmp_path / "run" / "plots").glob("*.png")} == {
        "auc.png", "layers.png", "relearning.png", "tradeoff.png"
    }  # fmt: skip
    assert "Matched forgetting" in report and "positive control" in report
    assert any("running" in line for line in logs)

    from lacuna_unlearn.bench.cli.main import main

    results_file = str(tmp_path / "run" / "results.json")
    junit = tmp_path / "gate.xml"
    assert main(["gate", results_file, "--method", "oracle_grad", "--min-auc", "0.85", "--junit", str(junit)]) == 0
    assert junit.is_file()
    assert main(["gate", results_file, "--min-auc", "1.01"]) == 2  # no AUC can meet it: refused, not failed
    assert main(["gate", results_file, "--method", "grad_diff", "--min-auc", "0.99"]) == 1  # not localized
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


def _comparable(results: dict, out) -> str:
    """``results`` as JSON without what legitimately differs between two runs: wall times, the machine, and the
    run's own directory."""
    volatile = ("seconds", "hardware", "versions", "started", "finished")

    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not any(v_ in k for v_ in volatile)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return json.dumps(strip(results), sort_keys=True, default=str).replace(str(out), "OUT")


def test_same_command_twice_gives_the_same_results(smoke_testbed, tmp_path):
    """Same config, same seed, same machine, two fresh run directories (no shared stage cache): results.json is
    identical except wall times and paths (issue 20: run-to-run determinism)."""
    overrides = {
        "testbed": str(smoke_testbed),
        "methods": {"grad_diff": _cheap("grad_diff", [])},
        "eval.tasks": ["forget_qa", "retain_qa"],
        "score.composite_samples": 2000,
        "score.frag": True,
        "attack.enabled": False,
        "reversibility.enabled": False,
        "trajectory.enabled": False,
    }
    first = run_benchmark(tmp_path / "a", load_run_config(preset="smoke", overrides=overrides), log=lambda line: None)
    second = run_benchmark(tmp_path / "b", load_run_config(preset="smoke", overrides=overrides), log=lambda line: None)
    a, b = _comparable(first, tmp_path / "a"), _comparable(second, tmp_path / "b")
    if a != b:
        diverged = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        pytest.fail(
            f"results differ near: ...{a[max(0, diverged - 200) : diverged + 100]}... vs ...{b[max(0, diverged - 200) : diverged + 100]}..."
        )
