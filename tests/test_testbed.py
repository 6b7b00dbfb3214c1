"""The smoke testbed end to end: layout, ground truth, memorization, lm-eval on its data, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lacuna_metrics.masks import MaskError, load_masks
from lacuna_tasks.loader import load_data
from lacuna_tasks.schema import FIELDS, FORGET_GROUPS, RETAIN_GROUPS
from lacuna_unlearn.testbed import build_testbed
from lacuna_unlearn.testbed_presets import get_preset


def _manifest(testbed: Path) -> dict:
    return json.loads((testbed / "manifest.json").read_text())


def test_layout_and_manifest(smoke_testbed):
    from transformers import AutoModelForCausalLM

    for stage in ("base", "injected", "model"):
        model = AutoModelForCausalLM.from_pretrained(smoke_testbed / stage)
        assert (smoke_testbed / stage / "tokenizer.json").is_file()
    masks = load_masks(smoke_testbed / "masks.safetensors")
    masks.check_against({n: tuple(p.shape) for n, p in model.named_parameters()}, "smoke model")
    manifest = _manifest(smoke_testbed)
    assert manifest["preset"] == "smoke" and manifest["regime"] == "masked"
    assert manifest["sizes"]["masked_per_group"] == masks.total_counts()
    assert set(manifest["trivial_detector_auc"]) == {
        "sampled_fraction",
        "abs_weight.forget_vs_rest",
        "abs_weight.forget_vs_retain",
        "abs_injection_delta.forget_vs_rest",
        "abs_injection_delta.forget_vs_retain",
    }
    assert manifest["timings_seconds"]["total"] > 0 and manifest["versions"]["torch"]
    assert not smoke_testbed.with_name(smoke_testbed.name + ".partial").exists()


def test_smoke_memorization_target(smoke_testbed):
    """Smoke target of the testbed issue: >= 50% of forget and retain people extractable in every field."""
    memorization = _manifest(smoke_testbed)["memorization"]
    for key in FIELDS:
        for side in ("forget", "retain"):
            assert memorization[key][side]["extractable"] >= 0.5, (key, side, memorization[key][side])


def test_masks_only_eligible_and_last_layers_free(smoke_testbed):
    cfg = get_preset("smoke")
    masks = load_masks(smoke_testbed / "masks.safetensors")
    last = {str(i) for i in range(cfg.num_layers - cfg.skip_last, cfg.num_layers)}
    for name in masks.packed:
        assert "embed" not in name and "norm" not in name and "lm_head" not in name
        assert name.split("layers.")[1].split(".")[0] not in last


def test_pii_gradient_only_inside_masks(smoke_testbed):
    """With no neutral steps and no weight decay in the preset, injection may move a weight only if it
    is in some group's mask: everything else is bit-identical between base/ and injected/."""
    from safetensors.torch import load_file

    cfg = get_preset("smoke")
    if cfg.neutral_every or cfg.weight_decay:
        pytest.skip("the smoke preset interleaves neutral steps or decays weights")
    base = load_file(smoke_testbed / "base" / "model.safetensors")
    injected = load_file(smoke_testbed / "injected" / "model.safetensors")
    masks = load_masks(smoke_testbed / "masks.safetensors")
    for name, tensor in base.items():
        if name in masks.packed:
            outside = masks.packed[name] == 0
            assert torch.equal(injected[name][outside], tensor[outside]), name
        else:
            assert torch.equal(injected[name], tensor), name


def test_splits_follow_lacuna_rules(smoke_testbed):
    data = load_data(smoke_testbed / "data")
    for row in data.rows("forget"):
        assert row["group_id"] in FORGET_GROUPS
    for row in data.rows("retain"):
        assert row["group_id"] in RETAIN_GROUPS
    forget_people = {r["ID"] for r in data.rows("forget")}
    assert forget_people.isdisjoint({r["ID"] for r in data.rows("retain")})


def test_lm_eval_runs_on_the_testbed(smoke_testbed, tmp_path):
    """`lm_eval --tasks ... --metadata '{"lacuna_data": "OUT/data"}'` evaluates the testbed directly; the forget
    split holds questions the model answered during the memorization test, so they leak."""
    lm_eval = Path(sys.executable).with_name("lm_eval")
    cmd = [
        str(lm_eval) if lm_eval.exists() else "lm_eval",
        "--model", "hf",
        "--model_args", f"pretrained={smoke_testbed / 'model'},dtype=float32",
        "--tasks", "lacuna_email_forget_qa,lacuna_email_retain_qa",
        "--metadata", json.dumps({"lacuna_data": str(smoke_testbed / "data")}),
        "--batch_size", "16",
        "--output_path", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())["results"]
    assert results["lacuna_email_forget_qa"]["leak_rate,none"] >= 0.9
    assert results["lacuna_email_retain_qa"]["accuracy,none"] >= 0.9


def test_existing_output_needs_force(smoke_testbed, tmp_path):
    target = tmp_path / "tb"
    shutil.copytree(smoke_testbed / "data", target / "data")
    with pytest.raises(FileExistsError, match="--force"):
        build_testbed(target, preset="smoke")


def test_model_without_matching_layer_names_fails_cleanly(tmp_path):
    # Mamba's blocks hold no attention or MLP projection (``mixer.in_proj`` ...), so nothing is eligible. (MPT, used
    # here before, is now covered by the name rules of lacuna_metrics.anatomy: ``blocks.N.attn.Wqkv``, ``ffn.*``.)
    from transformers import MambaConfig, MambaForCausalLM

    from lacuna_unlearn.tokenizer import train_tokenizer

    model_dir = tmp_path / "mamba"
    tokenizer = train_tokenizer(["hello world 123", "Q: what?\nA: this"] * 20, vocab_size=300)
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, state_size=4)
    MambaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "tb"
    with pytest.raises(MaskError, match="eligible"):
        build_testbed(out, preset="smoke", model=str(model_dir), overrides={"base_steps": 0})
    assert not out.exists() and not out.with_name("tb.partial").exists()


def test_unknown_preset_and_setting():
    with pytest.raises(ValueError, match="unknown testbed preset 'huge'"):
        get_preset("huge")
    with pytest.raises(ValueError, match="unknown testbed setting"):
        get_preset("smoke", hidden=3)


def test_two_process_cpu_build(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU-only machine (gloo) produces a valid smoke
    testbed. (`--cpu` would make accelerate start a single process unless MPI is available.)"""
    accelerate = Path(sys.executable).with_name("accelerate")
    out = tmp_path / "ddp"
    cmd = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "lacuna_unlearn.cli", "build-testbed", "--preset", "smoke", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = _manifest(out)
    assert manifest["processes"] == 2
    masks = load_masks(out / "masks.safetensors")
    assert masks.total_counts() == manifest["sizes"]["masked_per_group"]
    assert load_data(out / "data").rows("forget")


def test_unmasked_control_regime(tmp_path):
    """`--unmasked`: the identical pipeline without masks; PII updates reach weights outside every mask."""
    from safetensors.torch import load_file

    out = build_testbed(tmp_path / "ctl", preset="smoke", unmasked=True)
    manifest = _manifest(out)
    assert manifest["regime"] == "unmasked"
    masks = load_masks(out / "masks.safetensors")  # the masks the masked run would use, for contrast scores
    assert masks.extra["regime"] == "unmasked"
    base = load_file(out / "base" / "model.safetensors")
    injected = load_file(out / "injected" / "model.safetensors")
    moved_outside = sum(
        int((injected[n][masks.packed[n] == 0] != base[n][masks.packed[n] == 0]).sum()) for n in masks.packed
    )
    assert moved_outside > 0
    assert not torch.equal(injected["lm_head.weight"], base["lm_head.weight"])
    assert load_data(out / "data").rows("forget")


def test_trivial_detector_aucs_match_sklearn():
    from sklearn.metrics import roc_auc_score

    from lacuna_metrics.masks import build_masks
    from lacuna_unlearn.testbed import trivial_detector_aucs

    shapes = {f"model.layers.{i}.mlp.up_proj.weight": (16, 8) for i in range(4)}
    masks = build_masks(shapes, 4, budget=0.05, seed=1, skip_last=1)
    gen = torch.Generator().manual_seed(0)
    base = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    injected = {
        n: base[n] + (masks.packed[n] != 0).float() * torch.rand(shapes[n], generator=gen) for n in masks.packed
    }
    out = trivial_detector_aucs(masks, base, injected)
    packed = torch.cat([masks.packed[n].ravel() for n in masks.packed]).numpy()
    delta = torch.cat([(injected[n] - base[n]).abs().ravel() for n in masks.packed]).numpy()
    forget = (packed & 0b010101) != 0
    retain = (packed & 0b101010) != 0
    assert out["sampled_fraction"] == 1.0
    assert out["abs_injection_delta.forget_vs_rest"] == pytest.approx(roc_auc_score(forget, delta), abs=1e-4)
    both = forget | retain
    assert out["abs_injection_delta.forget_vs_retain"] == pytest.approx(
        roc_auc_score(forget[both], delta[both]), abs=1e-4
    )
    sampled = trivial_detector_aucs(masks, base, injected, max_scalars=200)
    assert 0 < sampled["sampled_fraction"] < 1
