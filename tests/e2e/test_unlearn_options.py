"""Trainer options beyond the plain run: LoRA (merged on save), gradient checkpointing, FRP through the Hydra
app, a 2-process CPU (gloo) run, and clear errors for bad splits and combinations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lacuna_unlearn.lora import LoraSettings
from lacuna_unlearn.methods import make_method
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


def _app(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def test_lora_saves_a_merged_model_that_unlearned(tiny_lacuna, tiny_email_rows, forget_nll, tmp_path):
    from transformers import AutoModelForCausalLM

    forget, retain = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir,
        forget,
        retain,
        make_method("grad_diff"),
        tmp_path / "lora",
        train=TrainConfig(learning_rate=2e-2, max_steps=6, per_device_train_batch_size=4),
        lora=LoraSettings(r=4, lora_alpha=8),
    )
    assert not (out / "adapter_config.json").exists() and not (out / "adapter_model.safetensors").exists()
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)  # a plain HF checkpoint
    before, after = _weights(tiny_lacuna.model_dir), _weights(out)
    assert sorted(after) == sorted(before)  # no lora_A/lora_B or base_model prefixes left
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed and all(".layers." in n and n.endswith("proj.weight") for n in changed)  # only block linears
    assert forget_nll(out, forget) > forget_nll(tiny_lacuna.model_dir, forget) + 0.5
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["lora"]["r"] == 4 and manifest["processes"] == 1
    assert model.config.vocab_size > 0


def test_lora_targets_and_layers_are_respected(tiny_lacuna, tiny_email_rows, tmp_path):
    forget, retain = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir,
        forget,
        retain,
        make_method("npo"),
        tmp_path / "lora_q",
        train=TrainConfig(
            learning_rate=2e-2, max_steps=2, per_device_train_batch_size=4, extra={"gradient_checkpointing": True}
        ),
        lora=LoraSettings(r=2, target_modules=["q_proj"], layers=[0]),
    )
    before, after = _weights(tiny_lacuna.model_dir), _weights(out)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == {"model.layers.0.self_attn.q_proj.weight"}


def test_lora_and_restriction_do_not_mix(tiny_lacuna, tiny_email_rows, tmp_path):
    forget, retain = tiny_email_rows
    with pytest.raises(ValueError, match="cannot be combined with LoRA"):
        unlearn(
            tiny_lacuna.model_dir, forget, retain, make_method("grad_diff"), tmp_path / "x",
            restrict="regex:mlp", lora=LoraSettings(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="lora.r must be >= 1"):
        LoraSettings(r=0)
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_hydra_lora_switch_and_frp_method(tiny_lacuna, tmp_path):
    common = [f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email"]
    out = tmp_path / "ga_lora"
    proc = _app(
        "method=grad_ascent", "lora.enabled=true", "lora.r=2", "trainer.args.max_steps=1",
        f"output_dir={out}", *common, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "unlearn_manifest.json").read_text())["lora"]["r"] == 2

    frp = tmp_path / "frp"
    env_cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "lacuna_unlearn.trainer.app", "method=frp", "method.args.rho=0.25",
           "method.args.target=linear", f"output_dir={frp}", *common]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, LACUNA_CACHE=str(env_cache))
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((frp / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "frp" and manifest["config"]["rho"] == 0.25 and manifest["pruned_total"] > 0
    assert any(env_cache.rglob("*"))  # activation statistics cached for FRAG / the next run
    proc = _app("method=frp", f"output_dir={frp}", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "exists; pass force=true" in proc.stderr
    proc = _app("method=frp", "lora.enabled=true", f"output_dir={tmp_path / 'f2'}", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "lora and restrict do not apply" in proc.stderr


def test_missing_split_and_unknown_method_args_fail_cleanly(tiny_lacuna, tmp_path):
    common = [f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", f"output_dir={tmp_path / 'x'}"]
    proc = _app("method=grad_diff", "forget_split=nope", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "no split 'nope'" in proc.stderr
    proc = _app("method=grad_diff", "field=shoe_size", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "field='shoe_size'" in proc.stderr
    proc = _app("method=grad_diff", "+method.args.temperature=2", *common, cwd=tmp_path)
    assert proc.returncode == 2 and "method 'grad_diff'" in proc.stderr and "temperature" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_two_process_cpu_unlearning(tiny_lacuna, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` (gloo on CPU): one DDP run, one checkpoint."""
    accelerate = Path(sys.executable).with_name("accelerate")
    out = tmp_path / "ddp"
    cmd = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "lacuna_unlearn.trainer.app",
        "method=rmu", f"model={tiny_lacuna.model_dir}", f"data={tiny_lacuna.data_dir}", "field=email",
        "trainer.args.max_steps=2", "trainer.args.per_device_train_batch_size=2", f"output_dir={out}",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["processes"] == 2 and manifest["steps"] == 2
    assert not (tmp_path / "ddp.partial").exists()
