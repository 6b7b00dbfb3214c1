"""The gate never mixes checkpoints (issue: lm-eval results of checkpoint A gated with the score.json of B
reported B's AUC under A's name), and the content fingerprint the pairing rests on.

Real ``lacuna score`` / ``lacuna gate`` processes on tiny hand-made llama-shaped checkpoints: ``before``,
and two "unlearned" checkpoints A and B of the same architecture that differ in a few rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from gate_cli import gate
from safetensors.torch import load_file, save_file

from lacuna_metrics.weights.checkpoints import Checkpoint, file_fingerprint

LAYERS, HIDDEN, INTER, VOCAB = 4, 16, 32, 64


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g)}
    for i in range(LAYERS):
        for proj in ("q", "k", "v", "o"):
            state[f"model.layers.{i}.self_attn.{proj}_proj.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.gate_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g)
        state[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(HIDDEN, INTER, generator=g)
        state[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(HIDDEN)
    state["model.norm.weight"] = torch.ones(HIDDEN)
    state["lm_head.weight"] = torch.randn(VOCAB, HIDDEN, generator=g)
    return state


def _save(directory: Path, state: dict[str, torch.Tensor], **config: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": "llama", "num_hidden_layers": LAYERS, "tie_word_embeddings": False, **config}
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _changed(state: dict[str, torch.Tensor], name: str, rows: slice, delta: float) -> dict[str, torch.Tensor]:
    out = {k: v.clone() for k, v in state.items()}
    out[name][rows] += delta
    return out


def _lacuna(*args: Any) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("lacuna")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "lacuna_unlearn.bench.cli.main"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=env, timeout=600, check=False)


def lm_eval_out(root: Path, model_args: str, *, date: float | None = None, **config: Any) -> Path:
    """An lm-eval ``--output_path`` directory as lm-eval 0.4.x writes it (``config.model_args``, ``model_name``, ``date``)."""
    tasks = {
        "lacuna_email_forget_qa": {"leak_rate,none": 0.05},
        "lacuna_email_retain_qa": {"accuracy,none": 0.9},
    }
    pretrained = dict(p.split("=", 1) for p in model_args.split(","))["pretrained"]
    doc = {
        "results": tasks,
        "configs": {t: {"task": t} for t in tasks},
        "config": {"model": "hf", "model_args": model_args, "model_revision": "main", "model_sha": "", **config},
        "model_name": pretrained,
        "model_source": "hf",
        "date": time.time() if date is None else date,
    }
    path = root / "sanitized" / "results_2026-01-01T00-00-00.000001.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return root


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


# -------------------------------------------------------------------------------------------- fingerprint


def test_fingerprint_same_weights_in_two_directories(tmp_path):
    a = _save(tmp_path / "a", _state())
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    os.utime(b / "model.safetensors", (1_000_000_000, 1_000_000_000))  # mtimes do not count
    fp = Checkpoint(a).fingerprint()
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64
    assert Checkpoint(b).fingerprint() == fp == Checkpoint(a).fingerprint()
    # a fresh process computes the same value (no hash(), no per-process salt)
    code = "import sys; from lacuna_metrics.weights.checkpoints import Checkpoint; print(Checkpoint(sys.argv[1]).fingerprint())"
    proc = subprocess.run([sys.executable, "-c", code, str(b)], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == fp


def test_fingerprint_sees_one_changed_scalar_anywhere(tmp_path):
    # 4 MiB of float32: a change in the middle is beyond the first and last MiB (what schema-1 scores hashed)
    state = {"model.layers.0.mlp.up_proj.weight": torch.zeros(1024, 1024), "model.norm.weight": torch.ones(8)}
    before = Checkpoint(_save(tmp_path / "a", state)).fingerprint()
    for index in [(512, 512), (0, 0), (1023, 1023)]:
        changed = {k: v.clone() for k, v in state.items()}
        changed["model.layers.0.mlp.up_proj.weight"][index] = 1e-30
        assert Checkpoint(_save(tmp_path / f"b{index[0]}", changed)).fingerprint() != before
    # the same values under another dtype, shape or name are other weights
    assert Checkpoint(_save(tmp_path / "bf16", {k: v.bfloat16() for k, v in state.items()})).fingerprint() != before
    reshaped = {**state, "model.layers.0.mlp.up_proj.weight": torch.zeros(512, 2048)}
    assert Checkpoint(_save(tmp_path / "shape", reshaped)).fingerprint() != before
    renamed = {"model.layers.1.mlp.up_proj.weight" if k.startswith("model.layers") else k: v for k, v in state.items()}
    assert Checkpoint(_save(tmp_path / "name", renamed)).fingerprint() != before


def test_fingerprint_ignores_layout_config_and_tokenizer(tmp_path):
    """Decision: the fingerprint names the weights. Sharded, single-file, .bin, tensor order and safetensors
    metadata do not change it; config.json (other than weight tying) and tokenizer files are not covered."""
    state = _state(seed=4)
    single = Checkpoint(_save(tmp_path / "single", state)).fingerprint()
    sharded = _save(tmp_path / "sharded", {})
    (sharded / "model.safetensors").unlink()
    names = list(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[half:], names[:half])):  # other order, other files
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: state[n] for n in reversed(part)}, str(sharded / file), metadata={"shard": str(i)})
        weight_map.update(dict.fromkeys(part, file))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert len(Checkpoint(sharded).files) == 2
    assert Checkpoint(sharded).fingerprint() == single
    pickled = tmp_path / "bin"
    pickled.mkdir()
    shutil.copy(tmp_path / "single" / "config.json", pickled)
    torch.save(state, pickled / "pytorch_model.bin")
    assert Checkpoint(pickled).fingerprint() == single

    other = tmp_path / "other_files"
    shutil.copytree(tmp_path / "single", other)
    (other / "tokenizer.json").write_text("{}")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "transformers_version": "9.9"}))
    (other / "lacuna_score").mkdir()  # lacuna score's default --out is inside the checkpoint
    (other / "lacuna_score" / "score.json").write_text("{}")
    assert Checkpoint(other).fingerprint() == single

    # weight tying is part of what the weights mean: lm_head stored vs tied to the embedding
    untied = {k: v for k, v in state.items() if k != "lm_head.weight"}
    tied = Checkpoint(_save(tmp_path / "tied", untied, tie_word_embeddings=True)).fingerprint()
    assert tied != Checkpoint(_save(tmp_path / "untied", untied)).fingerprint()


def test_mask_file_fingerprint_covers_metadata(tmp_path):
    save_file(
        {"m": torch.zeros(4, dtype=torch.uint8)}, str(tmp_path / "a.safetensors"), metadata={"forget_groups": "0"}
    )
    save_file(
        {"m": torch.zeros(4, dtype=torch.uint8)}, str(tmp_path / "b.safetensors"), metadata={"forget_groups": "1"}
    )
    assert file_fingerprint(tmp_path / "a.safetensors") != file_fingerprint(tmp_path / "b.safetensors")
    assert file_fingerprint(tmp_path / "a.safetensors").startswith("sha256:")


# ---------------------------------------------------------------------------------------------- score.json


def test_score_names_its_checkpoints(pair):
    doc = json.loads(pair.score_a.read_text())
    assert doc["schema"] == "lacuna-bench/score" and doc["schema_version"] == 2
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
    assert gate(out, "--score", pair.score_a, "--max-leak", "0.1", "--min-auc", "0", "--json", report) == 0
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
        code = gate(out, "--score", pair.score_b, "--min-auc", "0", "--junit", junit, "--json", report, *extra)
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
    assert gate(out, out_b, "--score", pair.score_a, "--score", pair.score_b, "--min-auc", "0") == 0
    assert gate(out, out_b, "--score", pair.score_b, "--score", pair.score_a, "--min-auc", "0") == 2
    assert gate(out, out_b, "--score", pair.score_a, "--min-auc", "0") == 2  # one score for both


def test_real_cli_exit_codes(pair, tmp_path):
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a}")
    ok = _lacuna("gate", out, "--score", pair.score_a, "--min-auc", "0", "--max-leak", "0.1")
    assert ok.returncode == 0, ok.stderr
    assert "verified" in ok.stdout and "PASSED" in ok.stdout
    bad = _lacuna("gate", out, "--score", pair.score_b, "--min-auc", "0", "--json", tmp_path / "g.json")
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
    assert gate(out, "--score", pair.score_a, "--min-auc", "0") == 0


def test_old_score_without_fingerprints(pair, tmp_path, capsys):
    """Schema-1 score.json: refused with a one-line 're-score' message; --allow-unverified gates it with a
    warning, but still refuses when the checkpoint at its after path is not the evaluated one."""
    out = lm_eval_out(tmp_path / "lm_a", f"pretrained={pair.a}")
    old_a = _old_score(pair.score_a, tmp_path / "old_a" / "score.json")
    assert gate(out, "--score", old_a, "--min-auc", "0") == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "schema_version 1" in line and "re-score" in line and f"lacuna score --after {pair.a.resolve()}" in line
    assert "--allow-unverified" in line
    assert gate(out, "--score", old_a, "--min-auc", "0", "--allow-unverified") == 0
    captured = capsys.readouterr()
    assert "warning: unverified checkpoint" in captured.err and "UNVERIFIED" in captured.out
    old_b = _old_score(pair.score_b, tmp_path / "old_b" / "score.json")
    assert gate(out, "--score", old_b, "--min-auc", "0", "--allow-unverified") == 2
    assert "checkpoint mismatch" in capsys.readouterr().err


def test_evaluated_checkpoint_gone(pair, tmp_path, capsys):
    gone = tmp_path / "deleted_ckpt"
    out = lm_eval_out(tmp_path / "lm", f"pretrained={gone}")
    assert gate(out, "--score", pair.score_a, "--min-auc", "0") == 2
    line = capsys.readouterr().err.strip()
    assert str(gone) in line and "does not exist" in line and "\n" not in line
    assert gate(out, "--score", pair.score_a, "--min-auc", "0", "--allow-unverified") == 0
    assert "does not exist" in capsys.readouterr().err  # a warning, never a silent pass


def test_hub_model(pair, tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = lm_eval_out(tmp_path / "lm", "pretrained=lacuna-test/unlearned-a")  # model_sha "": not pinned
    assert gate(out, "--score", pair.score_a, "--min-auc", "0") == 2
    assert "pin no hub commit" in capsys.readouterr().err
    sha = "0123456789abcdef0123456789abcdef01234567"
    pinned = lm_eval_out(tmp_path / "lm_pinned", "pretrained=lacuna-test/unlearned-a", model_sha=sha)
    assert gate(pinned, "--score", pair.score_a, "--min-auc", "0") == 2
    assert "not in the local cache" in capsys.readouterr().err
    snapshot = tmp_path / "hub" / "models--lacuna-test--unlearned-a" / "snapshots" / sha
    shutil.copytree(pair.a, snapshot)
    assert gate(pinned, "--score", pair.score_a, "--min-auc", "0") == 0
    assert gate(pinned, "--score", pair.score_b, "--min-auc", "0") == 2
    assert "checkpoint mismatch" in capsys.readouterr().err


def test_checkpoint_rewritten_after_the_evaluation(pair, tmp_path, capsys):
    """lm-eval ran on an earlier checkpoint at the same path (re-run unlearning into the same --out)."""
    stamp = (pair.a / "model.safetensors").stat().st_mtime
    out = lm_eval_out(tmp_path / "lm", f"pretrained={pair.a}", date=stamp - 3600)
    assert gate(out, "--score", pair.score_a, "--min-auc", "0") == 2
    assert "rewritten after lm-eval evaluated it" in capsys.readouterr().err
    assert gate(out, "--score", pair.score_a, "--min-auc", "0", "--allow-unverified") == 0


def test_relative_path_and_adapters(pair, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(pair.root)
    out = lm_eval_out(tmp_path / "lm", f"pretrained={pair.a.name}")  # relative to the current directory
    assert gate(out, "--score", pair.score_a, "--min-auc", "0") == 0
    peft = lm_eval_out(tmp_path / "lm_peft", f"pretrained={pair.a},peft={tmp_path / 'adapter'}")
    assert gate(peft, "--score", pair.score_a, "--min-auc", "0") == 2
    assert "peft=" in capsys.readouterr().err


def test_lm_eval_without_score_is_not_fingerprinted(tmp_path):
    out = lm_eval_out(tmp_path / "lm", f"pretrained={tmp_path / 'nowhere'}")
    assert gate(out, "--max-leak", "0.1") == 0  # nothing is combined, nothing to verify


def test_run_results_of_two_checkpoints_in_one_method(tmp_path, capsys):
    def results(scored_fp: str) -> Path:
        entry = {
            "behaviour": {"forget_leak": 0.0},
            "checkpoint": {"path": "/runs/m/model", "fingerprint": "sha256:" + "a" * 64},
            "score_checkpoint": {"path": "/runs/m/model", "fingerprint": scored_fp},
        }
        doc = {"schema": {"name": "lacuna-bench/run", "version": 1}, "field": "email", "methods": {"m": entry}}
        path = tmp_path / scored_fp[-4:] / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        return path

    assert gate(results("sha256:" + "a" * 64), "--max-leak", "0.1") == 0
    assert gate(results("sha256:" + "b" * 64), "--max-leak", "0.1") == 2
    assert "checkpoint mismatch" in capsys.readouterr().err
