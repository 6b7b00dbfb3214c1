"""Testbed builds end to end: the smoke testbed's layout, ground truth, memorization, lm-eval on its data; the
two-process, unmasked-control, cut-down standard and leaky builds; bad models (the corpus, presets and settings
checks: tests/unlearn/testbed/test_testbed.py).
"""

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
from lacuna_unlearn.testbed.build import build_testbed
from lacuna_unlearn.testbed.presets import get_preset


def _manifest(testbed: Path) -> dict:
    return json.loads((testbed / "manifest.json").read_text())


#: The sizes every cut-down build of these tests shares (seconds on CPU; pipeline only: the tiny model memorizes
#: nothing, so every target counts as memorized for the splits). Each cut adds what its preset needs.
TINY_BUILD = {
    "profiles_per_group": 4, "distractor_profiles": 8, "bios_per_person": 1, "qa_per_field": 2,
    "lorem_paragraphs": 40, "vocab_size": 400, "hidden_size": 64, "seq_len": 64, "base_steps": 4, "base_batch": 2,
    "pii_batch": 2, "neutral_batch": 2, "qa_tune_steps": 2, "qa_tune_batch": 4, "memorization_prompts": 2,
    "splits_without_memorization": True, "leak_audit_composite_samples": 5000,
}  # fmt: skip


#: The smoke preset (its geometry: 10% per group, last layer free) cut down to TINY_BUILD: for the build's mechanics
#: (processes, regimes), not memorization.
SMOKE_CUT = {**TINY_BUILD, "intermediate_size": 256, "pii_steps": 24, "people_per_field": 2}
#: No outside slot (the presets' default since issue 34): the scalars outside every mask get no gradient of their own.
NO_SLOT = {"outside_slot": False, "outside_batch": None}
#: The pre-v2 ablation, which no preset uses since issue 34: one group per step, no neutral micro-batches, no weight
#: decay, so every scalar outside the masks stays bit-identical. Its masks show in |θ_before − θ_base| (unified AUC
#: 1.0), so its builds are gated as before issue 34 (forget-vs-retain at 0.75).
PRE_V2 = {
    **NO_SLOT, "step_mix": "interleaved", "neutral_every": 0, "weight_decay": 0.0,
    "leak_audit_target": "forget_vs_retain", "leak_audit_max_auc": 0.75,
}  # fmt: skip
#: The regime mini used before issue 34 (one group per step; a neutral micro-batch after every 8 PII ones, at 0.05x the
#: rate with its own AdamW moments; weight decay 0.01; no outside slot): masked scalars move more than the others.
INTERLEAVED = {
    **NO_SLOT, "step_mix": "interleaved", "neutral_every": 8, "neutral_lr_scale": 0.05,
    "neutral_optimizer": "separate", "weight_decay": 0.01,
}  # fmt: skip


def _moved_only_inside_masks(testbed: Path) -> None:
    """Injection moved some masked weights and nothing else: every scalar outside the masks, and every tensor
    without a mask, is bit-identical between base/ and injected/ (a preset with no neutral steps and no weight
    decay)."""
    from safetensors.torch import load_file

    base = load_file(testbed / "base" / "model.safetensors")
    injected = load_file(testbed / "injected" / "model.safetensors")
    masks = load_masks(testbed / "masks.safetensors")
    moved_inside = 0
    for name, tensor in base.items():
        if name in masks.packed:
            outside = masks.packed[name] == 0
            assert torch.equal(injected[name][outside], tensor[outside]), name
            moved_inside += int((injected[name][~outside] != tensor[~outside]).sum())
        else:
            assert torch.equal(injected[name], tensor), name
    assert moved_inside > 0


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
    audit = manifest["leak_audit"]
    assert (audit["target"], audit["max_auc"]) == ("all", 0.60)
    assert audit["passed"] and audit["worst"]["auc"] <= audit["max_auc"]
    assert set(audit["trivial"]) == {"before_magnitude", "injection_magnitude", "trace_classifier"}
    assert set(audit["null"]) == {"gaussian", "adam_sign"} and "reversal" in audit["null"]["adam_sign"]
    heldout = [
        json.loads(line)["text"] for line in (smoke_testbed / manifest["neutral_heldout"]).read_text().splitlines()
    ]
    assert heldout and manifest["sizes"]["neutral_documents"]["heldout"] == len(heldout)
    assert manifest["sizes"]["split_people"]["forget"]["Email Address"] >= 1
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


def test_pii_gradient_only_inside_masks(tmp_path):
    """The pre-v2 ablation (no neutral steps, no weight decay; passed explicitly, as no preset uses it): injection
    may move a weight only if it is in some group's mask, everything else is bit-identical between base/ and
    injected/. Sizes cut (SMOKE_CUT): the property is in the mechanics."""
    out = build_testbed(tmp_path / "pre_v2", preset="smoke", overrides={**SMOKE_CUT, **PRE_V2})
    _moved_only_inside_masks(out)


@pytest.mark.parametrize("regime", ["outside_slot", "all_groups", "interleaved", "pre_v2"])
def test_every_target_gate_passes_trace_free_regimes_and_fails_one_group_per_step(tmp_path, regime):
    """The leak audit's default gate (every method-free detector <= 0.60 on every target). The regimes of issue 34
    leave no magnitude trace and pass: the presets' outside slot (the scalars outside every mask trained like a
    seventh group, on neutral text) and LACUNA's step (every group's PII and neutral text in every step, the neutral
    loss scaled down). The control: one group per step without the slot (mini's regime before issue 34, and the
    pre-v2 ablation) moves masked scalars more than the others, and the same gate fails the build on unified, where
    the forget-vs-retain gate it had passed. Sizes cut (SMOKE_CUT, 60 PII micro-batches): seconds."""
    from lacuna_unlearn.testbed.build import TestbedError

    regimes = {
        "outside_slot": {},  # the smoke preset's own regime
        "all_groups": {**NO_SLOT, "step_mix": "all_groups", "neutral_optimizer": "shared",
                       "neutral_loss_scale": 0.05, "weight_decay": 0.01},
        "interleaved": INTERLEAVED,
        "pre_v2": {k: v for k, v in PRE_V2.items() if not k.startswith("leak_audit")},
    }  # fmt: skip
    cut = {**SMOKE_CUT, "pii_steps": 60, **regimes[regime], "leak_audit_target": "all", "leak_audit_max_auc": 0.6}
    out = tmp_path / regime
    if regime in ("outside_slot", "all_groups"):
        audit = _manifest(build_testbed(out, preset="smoke", overrides=cut))["leak_audit"]
        assert audit["passed"] and audit["target"] == "all"
        for detector, aucs in audit["trivial"].items():
            assert all(v <= 0.6 for v in aucs.values()), (detector, aucs)
        return
    with pytest.raises(TestbedError, match=r"above 0\.6 AUC on every target: .*(injection_magnitude|trace_classifier) "
                                           r"\S+ on unified"):  # fmt: skip
        build_testbed(out, preset="smoke", overrides=cut)
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    passed = _manifest(build_testbed(out, preset="smoke", overrides={**cut, "leak_audit_target": "forget_vs_retain",
                                                                       "leak_audit_max_auc": 0.75}))  # fmt: skip
    assert passed["leak_audit"]["passed"]  # the gate before issue 34 let it through


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
    # here before, is now covered by the name rules of lacuna_metrics.weights.anatomy: ``blocks.N.attn.Wqkv``, ``ffn.*``.)
    from transformers import MambaConfig, MambaForCausalLM

    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    model_dir = tmp_path / "mamba"
    tokenizer = train_tokenizer(["hello world 123", "Q: what?\nA: this"] * 20, vocab_size=300)
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4, state_size=4)
    MambaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "tb"
    with pytest.raises(MaskError, match="eligible"):
        build_testbed(out, preset="smoke", model=str(model_dir), overrides={"base_steps": 0})
    assert not out.exists() and not out.with_name("tb.partial").exists()


def test_two_process_cpu_build(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU-only machine (gloo) builds a complete testbed
    whose injection, its gradients averaged over two processes, still moved only masked weights (the pre-v2
    ablation, passed explicitly). (`--cpu` would make accelerate start a single process unless MPI is available.)
    Sizes cut (SMOKE_CUT): this tests the processes, not memorization, which the session's smoke testbed covers."""
    accelerate = Path(sys.executable).with_name("accelerate")
    out = tmp_path / "ddp"
    cmd = [
        str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "lacuna_unlearn.bench.cli.main", "build-testbed", "--preset", "smoke", "--out", str(out),
    ]  # fmt: skip
    cmd += [arg for key, value in {**SMOKE_CUT, **PRE_V2}.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = _manifest(out)
    assert manifest["processes"] == 2
    assert manifest["config"]["pii_steps"] == SMOKE_CUT["pii_steps"]
    masks = load_masks(out / "masks.safetensors")
    assert masks.total_counts() == manifest["sizes"]["masked_per_group"]
    _moved_only_inside_masks(out)
    assert load_data(out / "data").rows("forget")
    assert not out.with_name("ddp.partial").exists()


def test_unmasked_control_regime(tmp_path):
    """`--unmasked`: the identical pipeline without masks; PII updates reach weights outside every mask. Sizes cut
    (SMOKE_CUT): the contrast with the masked regime is in the mechanics, not in what the model memorizes."""
    from safetensors.torch import load_file

    out = build_testbed(tmp_path / "ctl", preset="smoke", unmasked=True, overrides=SMOKE_CUT)
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


def test_retain_eval_people_are_memorized_and_in_no_other_split(smoke_testbed):
    """Held-out retain-eval people: the testbed's model answers their questions (they passed the memorization test)
    and none of them appears in any other split, so no unlearning input contains them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_metrics.behaviour.probes import extraction_hits
    from lacuna_tasks.prompts import probe_prompt

    data = load_data(smoke_testbed / "data")
    rows = data.rows("retain_eval")
    assert rows and all(r["group_id"] in RETAIN_GROUPS for r in rows)
    held_out = {r["ID"] for r in rows}
    for split, split_rows in data.splits.items():
        if not split.startswith("retain_eval"):
            assert held_out.isdisjoint({r["ID"] for r in split_rows}), split
    model = AutoModelForCausalLM.from_pretrained(smoke_testbed / "model")
    tok = AutoTokenizer.from_pretrained(smoke_testbed / "model")
    hits = extraction_hits(model, tok, [probe_prompt(r["question"]) for r in rows], [r["answer"] for r in rows],
                           [r["field"] for r in rows])  # fmt: skip
    assert sum(hits) >= 0.75 * len(hits), hits


#: The standard preset cut down to TINY_BUILD (well under a minute on CPU), keeping its geometry.
STANDARD_CUT = {
    **TINY_BUILD, "varied_qa_per_field": 2, "num_layers": 4, "num_heads": 4, "intermediate_size": 128,
    "pii_steps": 16, "grad_accum": 2, "people_per_field": 4, "retain_eval_people": 1, "validation_people": 1,
    "robustness_people": 1,
}  # fmt: skip


def test_standard_preset_builds_end_to_end_on_cpu(tmp_path):
    """LACUNA's geometry (5% per group, last two layers outside the masks, neutral text unmasked, wd 0.1), sizes
    cut down: every stage runs, weights outside the masks move during injection, the audit and held-out text exist."""
    from safetensors.torch import load_file

    cfg = get_preset("standard")
    assert (cfg.budget, cfg.skip_last, cfg.weight_decay, cfg.people_per_field) == (0.05, 2, 0.1, 100)
    assert cfg.neutral_every >= 1 and cfg.retain_eval_people >= 30
    out = build_testbed(tmp_path / "std", preset="standard", overrides=STANDARD_CUT)
    manifest = _manifest(out)
    assert manifest["preset"] == "standard" and manifest["config"]["skip_last"] == 2
    assert manifest["injection"]["neutral_micro_batches"] > 0
    masks = load_masks(out / "masks.safetensors")
    for name in masks.packed:
        assert int(name.split("layers.")[1].split(".")[0]) < 2
    base = load_file(out / "base" / "model.safetensors")
    injected = load_file(out / "injected" / "model.safetensors")
    for name in masks.packed:
        outside = masks.packed[name] == 0
        assert (injected[name][outside] != base[name][outside]).float().mean() > 0.9, name
    assert not torch.equal(injected["model.norm.weight"], base["model.norm.weight"])
    assert manifest["leak_audit"]["passed"]
    assert manifest["leak_audit"]["inputs"]["before"] == str((out / "model").resolve())  # not OUT.partial
    assert manifest["sizes"]["split_people"]["retain_eval"]["Email Address"] == 1
    assert set(manifest["robustness"]["forget"]["email"]) >= {"j_p", "j_icr", "paraphrase_accuracy", "icr_accuracy"}
    assert (out / "data" / "neutral_heldout.jsonl").stat().st_size > 0


def test_leaky_configuration_fails_the_leak_audit(tmp_path):
    """The pre-v2 regime (no neutral micro-batches, no weight decay) leaves every scalar outside the masks where it
    was, so a null update's reversal score finds the masks (unified target): gated there, the build fails, loudly
    and leaving nothing behind."""
    out = tmp_path / "leaky"
    leaky = {**STANDARD_CUT, **PRE_V2, "leak_audit_target": "unified", "leak_audit_max_auc": 0.9}
    with pytest.raises(ValueError, match=r"leak audit failed: .*above 0\.9 AUC on unified"):
        build_testbed(out, preset="standard", overrides=leaky)
    assert not out.exists() and not out.with_name("leaky.partial").exists()


def test_masks_are_stamped_with_the_model_they_describe(smoke_testbed):
    """The testbed ties masks.safetensors to model/ (lacuna score then verifies, not warns)."""
    from lacuna_metrics.masks import MaskReader
    from lacuna_metrics.weights.checkpoints import Checkpoint

    reader = MaskReader(smoke_testbed / "masks.safetensors")
    assert reader.model_fingerprint == Checkpoint(smoke_testbed / "model").fingerprint()
