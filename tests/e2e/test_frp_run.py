"""FRP (docs/definitions.md#frp): the end-to-end run on the tiny memorizing model, with its cache (the scores,
masks and pruning against brute force: tests/unlearn/methods/test_frp.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from lacuna_unlearn.methods.frp import FRPConfig, run_frp

MLP = ("gate_proj", "up_proj", "down_proj")


# -- end to end ------------------------------------------------------------------------------------------------


def test_run_frp_end_to_end(tiny_lacuna, tmp_path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_metrics.frag.activations import calibration_texts

    forget = calibration_texts(tiny_lacuna.data_dir, "forget", 16)
    retain = calibration_texts(tiny_lacuna.data_dir, "retain", 16)
    cfg = FRPConfig(rho=0.1, calib_samples=8, max_length=64)
    cache = tmp_path / "cache"
    out = run_frp(tiny_lacuna.model_dir, forget, retain, tmp_path / "frp", cfg, cache_dir=cache)
    assert out == tmp_path / "frp" and not (tmp_path / "frp.partial").exists()
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "frp"
    assert manifest["config"]["rho"] == 0.1 and manifest["seed"] == 42
    assert manifest["calibration"]["forget_texts"] == 8 and manifest["calibration"]["activation_cache_hit"] is False
    assert manifest["calibration"]["activation_fingerprint"].startswith("sha256:")
    assert manifest["pruned_total"] == sum(manifest["pruned"].values()) > 0
    assert all(name.split(".")[-2] in MLP for name in manifest["pruned"])
    assert "torch" in manifest["versions"] and manifest["wall_seconds"] >= 0
    assert list(cache.glob("*.safetensors"))

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    AutoTokenizer.from_pretrained(out, local_files_only=True)
    original = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir, local_files_only=True)
    new_sd, old_sd = model.state_dict(), original.state_dict()
    for name, value in new_sd.items():
        if name in manifest["pruned"]:
            zeros = int((value == 0).sum()) - int((old_sd[name] == 0).sum())
            assert zeros == manifest["pruned"][name]
        else:
            assert torch.equal(value, old_sd[name]), name
    assert load_file(str(next(out.glob("*.safetensors"))))  # a real safetensors checkpoint

    out2 = run_frp(tiny_lacuna.model_dir, forget, retain, tmp_path / "frp2", cfg, cache_dir=cache)
    manifest2 = json.loads((out2 / "unlearn_manifest.json").read_text())
    assert manifest2["calibration"]["activation_cache_hit"] is True
    assert manifest2["calibration"]["activation_fingerprint"] == manifest["calibration"]["activation_fingerprint"]
    assert manifest2["pruned"] == manifest["pruned"]
    assert len(list(cache.glob("*.safetensors"))) == 1

    with pytest.raises(FileExistsError):
        run_frp(tiny_lacuna.model_dir, forget, retain, out, cfg, cache_dir=cache)
