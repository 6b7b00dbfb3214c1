"""The content fingerprint the gate's checkpoint pairing rests on, and the gate on results of two checkpoints in one
run, on tiny hand-made llama-shaped checkpoints (tests/helpers/gate_checkpoints.py). The pairing through real
``lacuna score`` / ``lacuna gate`` processes: tests/e2e/test_gate_checkpoints_cli.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from helpers.gate_checkpoints import _save, _state, lm_eval_out
from helpers.gate_cli import gate
from safetensors.torch import save_file

from lacuna_metrics.weights.checkpoints import Checkpoint, file_fingerprint

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
