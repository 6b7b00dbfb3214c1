"""LACUNA's released data directory through the real commands (issue 36), on the ``tiny_release`` fixture
(tests/helpers/release.py): the bare ``lm_eval`` CLI with ``--metadata '{"lacuna_data": "<size>/data-masked"}'`` and
``lacuna-unlearn data=<size>/data-masked model=<size>/masked/intruction_tuned``, each from a working directory outside
the repository. The loader's own tests: tests/tasks/test_release_data.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lacuna_tasks.loader import load_data

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _outside_repo(path: Path) -> Path:
    assert not path.resolve().is_relative_to(REPO), path
    return path


def _env() -> dict[str, str]:
    """The test's environment (its PYTHONPATH included: the code under test), offline."""
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def test_lm_eval_reads_the_release_data(tiny_release, tiny_lacuna, tmp_path):
    cwd = _outside_repo(tmp_path / "work")
    cwd.mkdir()
    data_dir = tiny_release.data("masked")
    cmd = [
        sys.executable, "-m", "lm_eval",
        "--model", "hf",
        "--model_args", f"pretrained={tiny_release.tuned('masked')},dtype=float32",
        "--tasks", "lacuna_email_forget_qa",
        "--metadata", json.dumps({"lacuna_data": str(data_dir)}),
        "--batch_size", "16",
        "--output_path", "out",
        "--log_samples",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results_file = max((cwd / "out").rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(results_file.read_text())
    (samples_file,) = results_file.parent.glob("samples_lacuna_email_forget_qa_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]

    forget = pq.read_table(data_dir / "data" / "Email_Address_forget.parquet").to_pylist()
    assert sorted(s["doc"]["person"] for s in samples) == sorted(r["ID"] for r in forget)
    assert sorted(s["doc"]["question"] for s in samples) == sorted(r["question"] for r in forget)
    provenance = results["configs"]["lacuna_email_forget_qa"]["metadata"]["lacuna_data"]
    data = load_data(data_dir)
    assert provenance["source"] == str(data_dir.resolve()) and provenance["fingerprint"] == data.fingerprint
    assert provenance["layout"] == "lacuna-release" and "Email_Address/full" in provenance["unused"]
    # the model to unlearn still knows what the tiny model memorized (its last block moved by 1e-3 only)
    by_person = {s["doc"]["person"]: s["leak_rate"] for s in samples}
    assert all(by_person[p] == 1.0 for p in tiny_lacuna.leaked_people), by_person
    leak = results["results"]["lacuna_email_forget_qa"]["leak_rate,none"]
    assert leak == pytest.approx(sum(by_person.values()) / len(by_person)) and leak > 0


def test_lacuna_unlearn_trains_on_the_release_data(tiny_release, tmp_path):
    cwd = _outside_repo(tmp_path / "work")
    cwd.mkdir()
    data_dir = tiny_release.data("masked")
    out = tmp_path / "unlearned"
    cmd = [
        sys.executable, "-m", "lacuna_unlearn.trainer.app",
        "method=grad_diff",
        f"data={data_dir}",
        f"model={tiny_release.tuned('masked')}",
        "field=email",
        "retain_field=crossfield",
        f"output_dir={out}",
        "trainer.args.max_steps=2",
        "trainer.args.per_device_train_batch_size=2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    files = data_dir / "data"

    def rows(name: str) -> int:
        return pq.read_metadata(files / name).num_rows

    assert manifest["steps"] == 2 and (out / "model.safetensors").is_file()
    assert manifest["data"]["fingerprint"] == load_data(data_dir).fingerprint
    assert manifest["data"]["forget"] == rows("Email_Address_forget.parquet")
    # LACUNA's Email_Address_CrossField: Birth City's retain rows and their paraphrased twins
    assert manifest["config"]["retain_from"] == [
        {"split": "retain", "field": "birth_city"},
        {"split": "retain_paraphrased", "field": "birth_city"},
    ]
    assert manifest["data"]["retain"] == rows("Birth_City_retain.parquet") + rows(
        "Birth_City_retain_paraphrased.parquet"
    )
    assert sorted(p.name for p in cwd.iterdir()) == []  # Hydra wrote nothing in the working directory
