"""Held-out retain-eval people through ``lacuna-unlearn`` (subprocess) and the tiny memorizing model's data: bad
``retain_field`` and held-out splits refused, a cross-field run records its retain rows, utility documents without a
retain-eval split (the splits and their validation: tests/tasks/harness/test_retain_eval.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lacuna_tasks.harness.utility import build_utility_docs, load_utility_docs
from lacuna_tasks.loader import load_data
from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

KW = {"seed": 3, "people_per_field": 5, "validation_people": 2}
RETAIN_EVAL_PEOPLE = 3


@pytest.fixture(scope="module")
def profiles():
    return generate_profiles(60, seed=3)


@pytest.fixture(scope="module")
def splits(profiles):
    return build_splits(profiles, retain_eval_people=RETAIN_EVAL_PEOPLE, **KW)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, profiles, splits) -> Path:
    return Path(write_dataset(tmp_path_factory.mktemp("retain_eval") / "data", profiles, splits))


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False, timeout=600)


def test_cli_refuses_bad_retain_field_and_held_out_splits(tiny_lacuna, data_dir, tmp_path):
    common = [f"model={tiny_lacuna.model_dir}", f"data={data_dir}", f"output_dir={tmp_path / 'x'}"]
    proc = _app("method=grad_diff", "retain_field=emial", *common, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "lacuna-unlearn: error: retain_field='emial': expected one of same, crossfield, email, phone, birth_city, "
        "drivers_license"
    )
    proc = _app("method=grad_diff", "retain_split=retain_eval", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "retain_split=retain_eval: a held-out evaluation split" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_cli_crossfield_run_records_its_retain_rows(tiny_lacuna, data_dir, tmp_path):
    out = tmp_path / "cross"
    proc = _app(
        "method=grad_diff", f"model={tiny_lacuna.model_dir}", f"data={data_dir}", "field=email",
        "retain_field=crossfield", "trainer.args.max_steps=1", f"output_dir={out}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["config"]["retain_field"] == "crossfield"
    assert manifest["config"]["retain_from"] == [
        {"split": "retain", "field": "birth_city"},
        {"split": "retain_paraphrased", "field": "birth_city"},
    ]
    assert manifest["data"]["retain"] == 2 * KW["people_per_field"]


def test_utility_docs_without_retain_eval_are_a_marked_placeholder(tiny_lacuna):
    data = load_data(tiny_lacuna.data_dir)
    assert build_utility_docs(data, field="email", population="retain_eval", facts="same") is None
    dd = load_utility_docs("email", "retain_eval", "same", lacuna_data=str(tiny_lacuna.data_dir))
    description = json.loads(dd["test"].info.description)
    assert "has no split 'retain_eval'" in description["lacuna_skipped"] and len(dd["test"]) == 1
    assert build_utility_docs(data, field="email", population="forget", facts="other")  # works on any data
