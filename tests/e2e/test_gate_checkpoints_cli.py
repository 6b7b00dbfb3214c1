"""The gate never mixes checkpoints (issue: lm-eval results of checkpoint A gated with the score.json of B
reported B's AUC under A's name), with real ``lacuna score`` / ``lacuna gate`` processes on tiny hand-made
llama-shaped checkpoints (tests/helpers/gate_checkpoints.py): ``before``, and two "unlearned" checkpoints A and B of
the same architecture that differ in a few rows. The fingerprint itself: tests/unlearn/bench/gate/test_gate_checkpoints.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.gate_checkpoints import LAYERS, _save, _state, lm_eval_out
from helpers.gate_cli import gate
from safetensors.torch import load_file, save_file

from lacuna_metrics.weights.checkpoints import Checkpoint, file_fingerprint


def _changed(state: dict[str, torch.Tensor], name: str, rows: slice, delta: float) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in state.items()}
    out[name][rows] += delta
    return out


def _lacuna(*args: Any) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lacuna")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "lacuna_unlearn.bench.cli.main"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=env, timeout=600, check=False)


class Pair:
    """before, two unlearned checkpoints A and B (same architecture, a few rows apart), masks, and a real
    ``lacuna score`` of each."""

    def __init__(self, root: Path) -> None:
        from lacuna_metrics.masks import build_masks, save_masks

        self.root = root
        base = _state()
        self.before = _save(root / "before", base)
        self.a = _save(root / "ckpt_a", _changed(base, "model.layers.0.mlp.up_proj.weight", slice(0, 3), 0.5))
        self.b = _save(root / "ckpt_b", _changed(base, "model.layers.1.mlp.up_proj.weight", slice(5, 7), 0.5))
        self.masks = root / "masks.safetensors"
        save_masks(build_masks({k: tuple(v.shape) for k, v in base.items()}, LAYERS, seed=3), self.masks)
        self.score_a = self._score(self.a, root / "score_a")
        self.score_b = self._score(self.b, root / "score_b")

    def _score(self, after: Path, out: Path) -> Path:
        proc = _lacuna(
            *("score", "--before", self.before, "--masks", self.masks, "--after", after, "--out", out),
            *("--no-frag", "--composite-samples", "0", "--quiet"),
        )
        assert proc.returncode == 0, proc.stderr
        return out / "score.json"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Pair:
    return Pair(tmp_path_factory.mktemp("gate_ckpts"))


def _old_score(path: Path, dest: Path) -> Path:
    """``path`` as lacuna-bench wrote it before schema 2: version 1, a fingerprint of the first/last MiB."""
    doc = json.loads(path.read_text())
    doc["schema_version"] = 1
    for entry in doc["manifest"]["inputs"].values():
        entry["fingerprint"] = "sha256:" + "0" * 64
    doc["manifest"]["masks"] = doc["manifest"]["masks"]["path"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc))
    return dest


# ---------------------------------------------------------------------------------------------- score.json


def test_score_names_its_checkpoints(pair):
    doc = json.loads(pair.score_a.read_text())
    assert doc["schema"] == "lacuna-bench/score" and doc["schema_version"] == 3
    inputs = doc["manifest"]["inputs"]
    assert inputs["after"] == {"path": str(pair.a.resolve()), "fingerprint": Checkpoint(pair.a).fingerprint()}
    assert inputs["before"] == {
        "path": str(pair.before.resolve()),
        "fingerprint": Checkpoint(pair.before).fingerprint(),
    }
    assert doc["manifest"]["masks"] == {"path": str(pair.masks.resolve()), "fingerprint": file_fingerprint(pair.masks)}
    other = json.loads(pair.score_b.read_text())["manifest"]["inputs"]
    assert other["after"]["fingerprint"] != inputs["after"]["fingerprint"]
    assert other["before"] == inputs["before"]
    assert doc["auc"]["forget"]["best"]["value"] is not None
    md = (pair.score_a.parent / "score.md").read_text()
    assert inputs["after"]["fingerprint"] in md and inputs["before"]["fingerprint"] in md


# ------------------------------------------------------------------------------------------------- gate


def test_matched_pair_passes_and_names_the_checkpoint(pair, tmp_path, capsys):
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a},dtype=float32")
    report = tmp_path / "gate.json"
    assert gate(out, "--score", pair.score_a, "--max-leak", "0.1", "--check", "auc_forget>=0", "--json", report) == 0
    text = capsys.readouterr().out
    fp = Checkpoint(pair.a).fingerprint()
    assert f"checkpoint: {pair.a.resolve()} ({fp[:19]}…) = {pair.score_a} after: verified" in text
    [entry] = json.loads(report.read_text())["inputs"]
    assert entry["kind"] == "lm-eval" and entry["checkpoint"]["verified"] is True
    assert entry["checkpoint"]["fingerprint"] == entry["checkpoint"]["score_after"]["fingerprint"] == fp
    assert entry["checkpoint"]["path"] == str(pair.a.resolve())


def test_checkpoint_a_results_with_checkpoint_b_score_are_refused(pair, tmp_path, capsys):
    """The issue: the gate reported B's AUC under A's name. Now it refuses, names both, writes nothing."""
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a},dtype=float32")
    junit, report = tmp_path / "reports" / "gate.xml", tmp_path / "reports" / "gate.json"
    for extra in ([], ["--allow-unverified"]):  # a proven mismatch is never overridable
        code = gate(
            out, "--score", pair.score_b, "--check", "auc_forget>=0", "--junit", junit, "--json", report, *extra
        )
        assert code == 2
        captured = capsys.readouterr()
        [line] = captured.err.splitlines()
        assert line.startswith("lacuna gate: error: checkpoint mismatch:")
        assert str(pair.a.resolve()) in line and str(pair.b.resolve()) in line and str(pair.score_b) in line
        assert Checkpoint(pair.a).fingerprint()[:19] in line and Checkpoint(pair.b).fingerprint()[:19] in line
        assert "auc" not in captured.out and "PASS" not in captured.out  # no verdict table
        assert not junit.parent.exists()  # no report, not even a temporary file
    # per lm-eval input: A's results with B's score are refused even when the other pair matches
    out_b = lm_eval_out(tmp_path / "lm_b", f"pretrained={pair.b}")
    assert gate(out, out_b, "--score", pair.score_a, "--score", pair.score_b, "--check", "auc_forget>=0") == 0
    assert gate(out, out_b, "--score", pair.score_b, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    assert gate(out, out_b, "--score", pair.score_a, "--check", "auc_forget>=0") == 2  # one score for both


def test_real_cli_exit_codes(pair, tmp_path):
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a}")
    ok = _lacuna("gate", out, "--score", pair.score_a, "--check", "auc_forget>=0", "--max-leak", "0.1")
    assert ok.returncode == 0, ok.stderr
    assert "verified" in ok.stdout and "PASSED" in ok.stdout
    bad = _lacuna("gate", out, "--score", pair.score_b, "--check", "auc_forget>=0", "--json", tmp_path / "g.json")
    assert bad.returncode == 2 and "checkpoint mismatch" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / "g.json").exists()


def test_same_weights_resaved_elsewhere_still_match(pair, tmp_path):
    """lm-eval evaluated a sharded copy of A in another directory: same weights, same checkpoint."""
    state = load_file(str(pair.a / "model.safetensors"))
    copy = tmp_path / "copy_of_a"
    shutil.copytree(pair.a, copy)
    (copy / "model.safetensors").unlink()
    names = sorted(state)
    save_file({n: state[n] for n in names[:5]}, str(copy / "model-00001-of-00002.safetensors"))
    save_file({n: state[n] for n in names[5:]}, str(copy / "model-00002-of-00002.safetensors"))
    weight_map = {n: f"model-0000{1 if i < 5 else 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    out = lm_eval_out(tmp_path / "lm", f"pretrained={copy}")
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0") == 0


def test_old_score_without_fingerprints(pair, tmp_path, capsys):
    """Schema-1 score.json: refused with a one-line 're-score' message; --allow-unverified gates it with a
    warning, but still refuses when the checkpoint at its after path is not the evaluated one."""
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a}")
    old_a = _old_score(pair.score_a, tmp_path / "old_a" / "score.json")
    assert gate(out, "--score", old_a, "--check", "auc_forget>=0") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "schema_version 1" in line and "re-score" in line and f"lacuna score --after {pair.a.resolve()}" in line
    assert "--allow-unverified" in line
    assert gate(out, "--score", old_a, "--check", "auc_forget>=0", "--allow-unverified") == 0
    captured = capsys.readouterr()
    assert "warning: unverified checkpoint" in captured.err and "UNVERIFIED" in captured.out
    old_b = _old_score(pair.score_b, tmp_path / "old_b" / "score.json")
    assert gate(out, "--score", old_b, "--check", "auc_forget>=0", "--allow-unverified") == 2
    assert "checkpoint mismatch" in capsys.readouterr().err


def test_evaluated_checkpoint_gone(pair, tmp_path, capsys):
    gone = tmp_path / "deleted_ckpt"
    out = lm_eval_out(tmp_path / "lm", f"pretrained={gone}")
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    line = capsys.readouterr().err.strip()
    assert str(gone) in line and "does not exist" in line and "\n" not in line
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0", "--allow-unverified") == 0
    assert "does not exist" in capsys.readouterr().err  # a warning, never a silent pass


def test_hub_model(pair, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = lm_eval_out(tmp_path / "lm", "pretrained=lacuna-test/unlearned-a")  # model_sha "": not pinned
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    assert "pin no hub commit" in capsys.readouterr().err
    sha = "0123456789abcdef0123456789abcdef01234567"
    pinned = lm_eval_out(tmp_path / "lm_pinned", "pretrained=lacuna-test/unlearned-a", model_sha=sha)
    assert gate(pinned, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    assert "not in the local cache" in capsys.readouterr().err
    snapshot = tmp_path / "hub" / "models--lacuna-test--unlearned-a" / "snapshots" / sha
    shutil.copytree(pair.a, snapshot)
    assert gate(pinned, "--score", pair.score_a, "--check", "auc_forget>=0") == 0
    assert gate(pinned, "--score", pair.score_b, "--check", "auc_forget>=0") == 2
    assert "checkpoint mismatch" in capsys.readouterr().err


def test_checkpoint_rewritten_after_the_evaluation(pair, tmp_path, capsys):
    """lm-eval ran on an earlier checkpoint at the same path (re-run unlearning into the same --out)."""
    stamp = (pair.a / "model.safetensors").stat().st_mtime
    out = lm_eval_out(tmp_path / "lm", f"pretrained={pair.a}", date=stamp - 3600)
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    assert "rewritten after lm-eval evaluated it" in capsys.readouterr().err
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0", "--allow-unverified") == 0


def test_relative_path_and_adapters(pair, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(pair.root)
    out = lm_eval_out(tmp_path / "lm", f"pretrained={pair.a.name}")  # relative to the current directory
    assert gate(out, "--score", pair.score_a, "--check", "auc_forget>=0") == 0
    peft = lm_eval_out(tmp_path / "lm_peft", f"pretrained={pair.a},peft={tmp_path / 'adapter'}")
    assert gate(peft, "--score", pair.score_a, "--check", "auc_forget>=0") == 2
    assert "peft=" in capsys.readouterr().err
