"""`lacuna meta --preset smoke` end to end on the smoke testbed (issue 38): the real `lacuna run`, noise controls
through the method pipeline, relearned and quantized evaluations, diagnostics, faithfulness pools; meta.json,
meta.md and the plots; and the pool's refusals (a checkpoint of another testbed, a missing run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _lacuna(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-m", "lacuna_unlearn.bench.cli.main", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=1800)
    if ok:
        assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


@pytest.fixture(scope="module")
def meta_run(smoke_testbed, tmp_path_factory) -> Path:
    """One `lacuna meta --preset smoke` run directory for the module."""
    run_dir = tmp_path_factory.mktemp("meta") / "run"
    _lacuna("meta", "--preset", "smoke", str(run_dir), "--set", f"testbed={smoke_testbed}", cwd=run_dir.parent)
    return run_dir


def test_meta_smoke_writes_the_tables_plots_and_every_number_with_its_n(meta_run):
    meta = json.loads((meta_run / "meta" / "meta.json").read_text())
    assert meta["schema"] == {"name": "lacuna-bench/meta", "version": 1}
    assert meta["manifest"]["config"]["meta"]["draws"] == 200 and meta["manifest"]["versions"]
    pool = meta["pool"]
    # 4 methods x 2 seeds + 2 noise controls (the first seed only)
    assert pool["models"] == 10 and len(pool["noise_controls"]) == 2
    assert {r["method"] for r in pool["rows"] if r["noise"]} == {"null_gaussian", "null_weight_decay"}
    sizes = pool["noise_sizes"]["email"]
    assert sizes["relative_size"] > 0 and sizes["median_method_l2"] > 0
    # every predictor x outcome cell carries n, its interval kind and the underpowered flag with its reason
    for p, row in meta["correlation"].items():
        for o, cell in row.items():
            assert isinstance(cell["n"], int) and cell["interval"] == "bootstrap", (p, o)
            if cell["rho"] is not None:  # a percentile interval need not contain ρ at a tiny, tied n
                assert -1 <= cell["rho"] <= 1 and -1 <= cell["low"] <= cell["high"] <= 1, (p, o)
            if cell["n"] < 8:
                assert cell["underpowered"] and "models" in cell["reason"], (p, o)
    # the same table over the models that forgot: exactly the rows whose plain leak is at most 0.1
    forgot = meta["correlation_forgot"]
    leaks = [r["predictors"]["forget_leak"] for r in pool["rows"]]
    assert forgot["models"] == sum(1 for v in leaks if v is not None and v <= 0.1)
    assert set(forgot["rho"]) == (set(meta["correlation"]) if forgot["models"] else set())
    # the diagnostics, relative L2 and FRAG entered as predictors of the first seed's models
    first = [r for r in pool["rows"] if r["seed"] == 1]
    assert all(r["predictors"].get("mean_pca_distance") is not None for r in first)
    assert all(r["predictors"].get("relative_l2") is not None for r in first)
    # faithfulness: (1 + 2 perturbations) evaluations per pool; the testbed model knows its forget people
    faith = meta["faithfulness"]
    assert faith["pools"] == {"knows": 3, "never_learned": 3}
    leak = faith["metrics"]["forget_leak"]
    assert leak["n_knows"] == 3 and leak["underpowered"] and leak["auc"] is not None
    # robustness over the first seed's models (4 methods + 2 noise controls), 8- and 4-bit
    rob = meta["robustness"]
    assert rob["models"] == 6
    for m, entry in rob["metrics"].items():
        for key in ("relearning", "quantization_8bit", "quantization_4bit"):
            cell = entry[key]
            assert cell["mean"] is None or 0.0 <= cell["mean"] <= 1.0, (m, key)
    text = (meta_run / "meta" / "meta.md").read_text()
    for heading in ("## ρ, pooled", "## Leave one method out", "## Noise controls", "## Faithfulness", "## Robustness"):
        assert heading in text
    plots = meta_run / "meta" / "plots"
    assert (plots / "ranking.png").stat().st_size > 0 and (plots / "scatter_frag.png").stat().st_size > 0
    assert meta["manifest"]["wall_seconds"] > 0


def test_a_second_meta_reuses_every_stage_and_gives_the_same_numbers(meta_run, tmp_path):
    first = json.loads((meta_run / "meta" / "meta.json").read_text())
    proc = _lacuna(
        "meta", str(meta_run), "--out", str(tmp_path / "again"), "--draws", "200", "--headline",
        "leak_relearned_forget", cwd=tmp_path,
    )  # fmt: skip
    assert ": running" not in proc.stderr + proc.stdout  # every stage cached
    again = json.loads((tmp_path / "again" / "meta.json").read_text())
    assert again["correlation"] == first["correlation"] and again["robustness"] == first["robustness"]
    assert again["settings"]["headline"] == "leak_relearned_forget"  # the plots' outcome, not a number's


def test_the_runs_own_release_tree_given_as_checkpoints_scores_what_the_run_scored(meta_run, tmp_path):
    """`--checkpoints RUN/lacuna/unlearned_models`: the run's chosen checkpoints in LACUNA's published layout,
    read as a release and measured again by content, not by the run's stage keys: every predictor and outcome is
    the run's own row's (deterministic stages), so a release's tree is scored as lacuna run scores its methods."""
    tree = meta_run / "lacuna" / "unlearned_models"
    out = tmp_path / "meta"
    _lacuna(
        "meta", str(meta_run), "--checkpoints", str(tree), "--out", str(out), "--no-noise", "--quantize", "8",
        "--draws", "200", cwd=tmp_path,
    )  # fmt: skip
    meta = json.loads((out / "meta.json").read_text())
    rows = meta["pool"]["rows"]
    listed = [r for r in rows if r["point"] == "checkpoint"]
    assert sorted(r["method"] for r in listed) == ["frp", "grad_diff", "rmu", "simnpo"]  # SimNPO mapped back
    assert {c["listed_in"] for c in meta["pool"]["checkpoints"]} == {str(tree)}
    assert meta["pool"]["models"] == 8 + 4  # 4 methods x 2 seeds, the 4 listed, no noise controls
    run_rows = {r["method"]: r for r in rows if r["point"] == "chosen" and r["seed"] == 1}
    for r in listed:
        twin = run_rows[r["method"]]
        assert "checkpoint" in r["model"] and str(tree) in r["model"]
        assert r["outcomes"] == twin["outcomes"], r["method"]
        assert r["predictors"] == twin["predictors"], r["method"]
    assert meta["robustness"]["models"] == 4 + 4


def test_points_end_adds_the_end_of_the_schedule_measured_as_a_method(meta_run, tmp_path):
    """`--points chosen,end`: a method the run stopped early joins the pool again at the end of its schedule. The
    smoke run stops nothing early, so its grad_diff entry is given the seed-2 checkpoint as its end of schedule (a
    real checkpoint of the testbed): the new row is measured through the run's stages (seed 1), so the numbers that
    do not depend on the seed (its forget leak, its L2) are those of the seed-2 row."""
    run = tmp_path / "run"
    run.mkdir()
    results = json.loads((meta_run / "results.json").read_text())
    email = results["by_field"]["email"]
    late = email["seed_entries"]["2"]["grad_diff"]
    email["methods"]["grad_diff"]["end_of_schedule"] = {"model": late["model"], "steps": 3}
    (run / "results.json").write_text(json.dumps(results))
    os.symlink(meta_run / "stages", run / "stages")
    _lacuna("meta", str(run), "--points", "chosen,end", "--no-noise", "--quantize", "8", "--draws", "200", cwd=tmp_path)
    meta = json.loads((run / "meta" / "meta.json").read_text())
    assert meta["pool"]["points"] == ["chosen", "end"] and meta["pool"]["models"] == 8 + 1
    end = [r for r in meta["pool"]["rows"] if r["point"] == "end"]
    assert [r["model"] for r in end] == ["grad_diff/email/seed 1 at end"]
    twin = next(r for r in meta["pool"]["rows"] if r["model"] == "grad_diff/email/seed 2")
    for key in ("forget_leak", "l2", "j_w", "prob"):
        assert end[0]["predictors"][key] == twin["predictors"][key], key
    assert end[0]["predictors"]["mean_pca_distance"] is not None  # the first seed's extra predictors too
    missing = {k for k, v in end[0]["outcomes"].items() if v is None}
    assert missing == {k for k, v in twin["outcomes"].items() if v is None}, end[0]["outcomes"]
    proc = _lacuna("meta", str(run), "--points", "end", cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "--points: distinct values of chosen,end,snapshots including chosen" in proc.stderr


def test_a_run_without_methods_pools_the_listed_checkpoints_only(meta_run, smoke_testbed, tmp_path):
    """`--preset smoke --set methods={}`: an evaluation-only run (baseline and controls) whose pool is the listed
    tree alone; its cells carry n = 4 and the underpowered flag, never a bare ρ. The stage cache is shared with the
    module's run, so only what is new runs."""
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(meta_run / "stages", run / "stages")
    tree = meta_run / "lacuna" / "unlearned_models"
    _lacuna(
        "meta", "--preset", "smoke", str(run), "--set", f"testbed={smoke_testbed}", "--set", "methods={}",
        "--checkpoints", str(tree), "--no-noise", "--quantize", "8", "--draws", "200", cwd=tmp_path,
    )  # fmt: skip
    meta = json.loads((run / "meta" / "meta.json").read_text())
    rows = meta["pool"]["rows"]
    assert len(rows) == 4 and {r["point"] for r in rows} == {"checkpoint"}
    first = json.loads((meta_run / "meta" / "meta.json").read_text())["pool"]["rows"]
    run_rows = {r["method"]: r for r in first if r["seed"] == 1 and not r["noise"]}
    for r in rows:
        assert r["outcomes"] == run_rows[r["method"]]["outcomes"], r["method"]
        assert r["predictors"] == run_rows[r["method"]]["predictors"], r["method"]
    for cells in meta["correlation"].values():
        for cell in cells.values():
            assert cell["n"] <= 4 and cell["underpowered"], cell


def test_a_checkpoint_of_another_testbed_in_the_pool_is_refused_naming_it(meta_run, tmp_path, tiny_lacuna):
    """A results.json whose entry points at a model of another architecture: one line naming the model."""
    other = tiny_lacuna.model_dir  # a tiny Llama: the smoke testbed's model is an OLMo-2
    run = tmp_path / "run"
    run.mkdir()
    results = json.loads((meta_run / "results.json").read_text())
    results["by_field"]["email"]["methods"]["simnpo"]["model"] = str(other)
    (run / "results.json").write_text(json.dumps(results))
    os.symlink(meta_run / "stages", run / "stages")
    proc = _lacuna("meta", str(run), cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "simnpo/email/seed 1" in line and str(other) in line and "not a checkpoint of the run's testbed" in line
    assert not (run / "meta").exists()


def test_a_directory_without_a_run_and_bad_flags_are_refused_before_any_work(tmp_path):
    proc = _lacuna("meta", str(tmp_path / "nothing"), cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "results.json: not found" in proc.stderr and "Traceback" not in proc.stderr
    proc = _lacuna("meta", str(tmp_path), "--set", "attack.attempts=2", cwd=tmp_path, ok=False)
    assert proc.returncode == 2 and "--set changes the run of a --preset" in proc.stderr
    for bad in ("9", "8,8", "x"):
        proc = _lacuna("meta", str(tmp_path), "--quantize", bad, cwd=tmp_path, ok=False)
        assert proc.returncode == 2 and "--quantize" in proc.stderr
    assert not any(tmp_path.iterdir()) or sorted(p.name for p in tmp_path.iterdir()) == []
