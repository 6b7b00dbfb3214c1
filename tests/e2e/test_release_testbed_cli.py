"""The LACUNA release as a testbed (issue 36 item 2): a regime directory ``<size>/<regime>/`` given where a testbed
goes, to ``lacuna-unlearn``, ``lacuna score``, ``lacuna attack`` and ``lacuna run``, each from a working directory
outside the repository, on a copy of the ``tiny_release`` fixture (tests/helpers/release.py). Each command finds
``intruction_tuned/``, ``mask.pt``, ``data-<regime>/`` and the ``unmasked/`` twin by itself
(lacuna_metrics/layout.py; docs/release.md, "The release as a testbed")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert not cwd.resolve().is_relative_to(REPO)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=1800)
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def _lacuna(*args: str) -> list[str]:
    return [sys.executable, "-m", "lacuna_unlearn.bench.cli.main", *args]


@pytest.fixture
def release(tiny_release, tmp_path) -> Path:
    """A private copy of the tiny release (the commands write into its regime directories)."""
    root = tmp_path / "artifacts"
    shutil.copytree(tiny_release.root, root)
    return root / tiny_release.size_dir.name


def _add_profiles(release: Path, tiny_lacuna) -> None:
    """The user's step before an extraction probe: PANORAMA-Plus's profiles beside each data card (the release
    ships none; LACUNA's own script downloads them)."""
    for regime in ("masked", "unmasked"):
        shutil.copy(tiny_lacuna.data_dir / "profiles.jsonl", release / f"data-{regime}" / "profiles.jsonl")


def test_unlearn_score_and_attack_on_the_release(release, tiny_lacuna, tmp_path):
    cwd = tmp_path / "work"
    cwd.mkdir()
    masked, unmasked = release / "masked", release / "unmasked"
    # lacuna-unlearn testbed=<regime>: the model to unlearn, the data and (restrict) the mask found by themselves,
    # written where LACUNA's scripts look; the same method on the unmasked twin is the contrast control
    for regime in (masked, unmasked):
        _run(
            [
                sys.executable, "-m", "lacuna_unlearn.trainer.app", "method=grad_diff", f"testbed={regime}",
                "field=email", f"output_dir={regime / 'unlearned_models' / 'Email_Address' / 'grad_diff'}",
                "trainer.args.max_steps=2", "trainer.args.learning_rate=1e-3",
            ],
            cwd,
        )  # fmt: skip
    after = masked / "unlearned_models" / "Email_Address" / "grad_diff"
    manifest = json.loads((after / "unlearn_manifest.json").read_text())
    assert manifest["config"]["testbed"] == str(masked)

    score_out = tmp_path / "score"
    _run(_lacuna("score", "--testbed", str(masked), "--after", str(after), "--out", str(score_out),
                 "--calib-fields", "email", "--null-draws", "2"), cwd)  # fmt: skip
    score = json.loads((score_out / "score.json").read_text())
    inputs = score["manifest"]["inputs"]
    assert inputs["before"]["path"] == str((masked / "intruction_tuned").resolve())
    assert inputs["control_before"]["path"] == str((unmasked / "intruction_tuned").resolve())
    assert inputs["control_after"]["path"] == str(
        (unmasked / "unlearned_models" / "Email_Address" / "grad_diff").resolve()
    )
    assert score["manifest"]["masks"]["path"] == str((masked / "mask.pt").resolve())
    assert "contrast" in score["auc"]["forget"] and score["frag"] is not None
    # LACUNA's own metrics.json per target, beside score.json
    assert (score_out / "lacuna" / "forget" / "metrics.json").is_file()

    attack_out = tmp_path / "attack"
    attack = _lacuna("attack", "--model", str(after), "--testbed", str(masked), "--field", "email", "--attempts", "2",
                     "--out", str(attack_out), "--set", "trainer.args.max_steps=2", "--set", "eval_fraction=0")  # fmt: skip
    refused = subprocess.run(attack, capture_output=True, text=True, cwd=cwd, timeout=600)
    assert refused.returncode == 2 and "srirxml/PANORAMA-Plus" in refused.stderr and not attack_out.exists()
    _add_profiles(release, tiny_lacuna)
    _run(attack, cwd)
    report = json.loads((attack_out / "attack.json").read_text())
    assert report["persons"] > 0 and (attack_out / "relearned" / "model.safetensors").is_file()


def test_run_on_the_release_writes_where_lacuna_looks(release, tiny_lacuna, tmp_path):
    cwd = tmp_path / "work"
    cwd.mkdir()
    _add_profiles(release, tiny_lacuna)
    masked = release / "masked"
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "methods": {"grad_diff": ["trainer.args.max_steps=2"]},
                "eval": {"tasks": ["forget_qa", "retain_qa", "forget_memorization"], "neutral_ppl": False},
                "score": {"composite_samples": 0, "null_draws": 2},
                "attack": {"attempts": 2, "overrides": ["trainer.args.max_steps=2", "eval_fraction=0"]},
                "reversibility": {"enabled": False},
                "trajectory": {"enabled": False},
                "stopping": {"points": 2},
            }
        )
    )
    _run(_lacuna("run", "--preset", "smoke", "--config", str(config), "--set", f"testbed={masked}"), cwd)
    out = masked / "lacuna-bench" / "smoke"  # no --out: the run directory inside the regime directory
    results = json.loads((out / "results.json").read_text())
    assert results["preset"] == "lacuna-release:OLMo2-1B/masked" and results["testbed"] == str(masked)
    entry = results["methods"]["grad_diff"]
    assert entry["behaviour"]["forget_leak"] is not None and entry["auc"]["forget"]["best"] is not None
    assert entry["stopping"]["people"] > 0  # the release's validation_Email_Address people
    # where LACUNA's scripts look: the model and its files under <regime>/unlearned_models/<Field>/<Method>/
    placed = masked / "unlearned_models" / "Email_Address" / "grad_diff"
    assert (placed / "model.safetensors").is_file() and (placed / "config.json").is_file()
    assert json.loads((placed / "Panorama_SUMMARY.json").read_text())["exact_memorization"] is not None
    assert (placed / "extraction_leakage.json").is_file()
    precision = masked / "cached_notebook_files" / "precision_metrics" / "forget" / "Email_Address" / "grad_diff"
    assert (precision / "metrics.json").is_file()
    # and under the run directory too
    assert (out / "lacuna" / "unlearned_models" / "Email_Address" / "grad_diff" / "model.safetensors").is_file()
