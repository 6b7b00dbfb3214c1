"""The ``lacuna-unlearn`` Hydra app: real subprocess runs with OpenUnlearning-style overrides, and its one-line
errors (the paper presets: tests/unlearn/trainer/test_train_app.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def test_overrides_reach_the_run_and_manifest(tiny_lacuna, tmp_path):
    out = tmp_path / "simnpo"
    proc = _app(
        "method=simnpo",
        f"model={tiny_lacuna.model_dir}",
        f"data={tiny_lacuna.data_dir}",
        "field=email",
        f"output_dir={out}",
        "method.args.beta=3",
        "trainer.args.learning_rate=3e-3",
        "trainer.args.max_steps=2",
        "trainer.args.per_device_train_batch_size=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "simnpo" and manifest["method_args"]["beta"] == 3
    assert manifest["train"]["learning_rate"] == 3e-3 and manifest["steps"] == 2
    assert manifest["config"]["field"] == "email" and manifest["data"]["fingerprint"].startswith("sha256:")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simnpo"]  # Hydra wrote nothing else


def test_errors_exit_2_with_one_line(tiny_lacuna, tmp_path):
    proc = _app("method=grad_diff", f"output_dir={tmp_path / 'x'}", cwd=tmp_path)
    assert proc.returncode == 2 and "give testbed=DIR, or model=CHECKPOINT and data=DATA" in proc.stderr
    proc = _app(
        "method=oracle_grad",
        f"model={tiny_lacuna.model_dir}",
        f"data={tiny_lacuna.data_dir}",
        f"output_dir={tmp_path / 'y'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "needs masks=PATH" in proc.stderr
    proc = _app("method=nope", "output_dir=z", cwd=tmp_path)
    assert proc.returncode != 0 and "method/nope" in proc.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
