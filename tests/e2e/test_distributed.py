"""Distributed engines on CPU (gloo, 2 processes): lm-eval's data-parallel split gives the same aggregates as
one process, and the unlearning trainer keeps ``restrict=forget_mask`` exact under accelerate's FSDP2.

What stock tools do on a CPU-only host, measured (details and the GPU commands: ``docs/distributed.md``):

* lm-eval 0.4.13 splits documents across ``accelerate launch`` processes only when it sees more than one
  CUDA device; on CPU each process evaluates everything. ``tests/helpers/lm_eval_cpu_dp.py`` switches the split
  on (rank/world size from the accelerator), so the 2-process run below goes through lm-eval's GPU code
  path: documents interleaved across ranks, per-document metrics gathered to rank 0, then aggregated.
* accelerate 1.15 drops the FSDP plugin on CPU and runs DDP (``test_stock_fsdp_on_cpu_runs_ddp_and_says_so``);
  torch 2.13 itself shards on CPU, so ``tests/helpers/accelerate_cpu_fsdp.py`` makes accelerate take its FSDP path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers import HELPERS

ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
LAUNCH_2 = ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
LM_EVAL_TASKS = "lacuna_email_forget_worstcase,lacuna_email_forget_memorization,lacuna_email_extraction"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_USE_FSDP", None)
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------- lm-eval


def _lm_eval(launcher: list[str], tiny, out: Path, env: dict[str, str]) -> tuple[dict, dict, str]:
    cmd = [
        *launcher,
        "--model", "hf",
        "--model_args", f"pretrained={tiny.model_dir},dtype=float32",
        "--tasks", LM_EVAL_TASKS,
        "--metadata", json.dumps({"lacuna_data": str(tiny.data_dir), "extraction_attempts": 3}),
        "--batch_size", "16",
        "--output_path", str(out),
        "--log_samples",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results_files = list(out.rglob("results_*.json"))
    assert len(results_files) == 1, results_files  # rank 0 alone writes
    samples = defaultdict(list)
    for file in results_files[0].parent.glob("samples_*.jsonl"):
        task = file.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines()]
    return json.loads(results_files[0].read_text())["results"], samples, proc.stderr


@pytest.fixture(scope="module")
def lm_eval_runs(tiny_lacuna, tmp_path_factory):
    one = _lm_eval([sys.executable, "-m", "lm_eval"], tiny_lacuna, tmp_path_factory.mktemp("lm_eval_1"), _env())
    two = _lm_eval(
        [ACCELERATE, "launch", "--multi_gpu", *LAUNCH_2, str(HELPERS / "lm_eval_cpu_dp.py")],
        tiny_lacuna,
        tmp_path_factory.mktemp("lm_eval_2"),
        _env(ACCELERATE_USE_CPU="true"),  # gloo on CPU processes (MULTI_CPU)
    )
    return one, two


def test_two_process_lm_eval_splits_every_persons_probes(lm_eval_runs):
    (_, one, _), (_, two, stderr) = lm_eval_runs
    assert "lm_eval_cpu_dp: rank 1 of 2" in stderr
    for task in LM_EVAL_TASKS.split(","):
        ids_one = [s["doc_id"] for s in one[task]]
        ids_two = [s["doc_id"] for s in two[task]]
        assert sorted(ids_two) == sorted(ids_one) == list(range(len(ids_one))), task
    # rank 0's documents come first in the gathered samples: persons' probes were split across the ranks
    worst = two["lacuna_email_forget_worstcase"]
    half = (len(worst) + 1) // 2
    assert [s["doc_id"] for s in worst[:half]] == list(range(0, len(worst), 2))
    by_rank = defaultdict(set)
    for i, sample in enumerate(worst):
        by_rank[sample["doc"]["person"]].add(i < half)
    assert by_rank and all(ranks == {True, False} for ranks in by_rank.values())


def test_two_process_lm_eval_aggregates_equal_one_process(lm_eval_runs):
    (one, _, _), (two, _, _) = lm_eval_runs
    assert set(one) == set(two)
    compared = 0
    for task, metrics in one.items():
        assert set(metrics) == set(two[task]), task
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                other = two[task][key]
                if math.isnan(value):
                    assert math.isnan(other), (task, key)
                else:  # batches differ between the runs: float sums may differ in the last bits
                    assert other == pytest.approx(value, rel=1e-6, abs=1e-9), (task, key, value, other)
                compared += 1
            else:
                assert value == two[task][key], (task, key)
    assert compared >= 10
    worst = one["lacuna_email_forget_worstcase"]
    assert worst["j_w,none"] > 0  # the tiny model leaks: the per-person union is not trivially 0
    assert worst["j_w,none"] >= max(worst["j_p,none"], worst["j_icr,none"])
    assert "success_at_n,none" in one["lacuna_email_extraction"]


# --------------------------------------------------------------------------------------------------- FSDP


@pytest.fixture(scope="module")
def fsdp_masks(tiny_lacuna, tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM

    from lacuna_metrics.masks import build_masks, named_shapes_of, save_masks

    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir)
    masks = build_masks(named_shapes_of(model), model.config.num_hidden_layers, budget=0.05, seed=3, skip_last=0)
    return save_masks(masks, tmp_path_factory.mktemp("fsdp_masks") / "masks.safetensors")


def _unlearn_2proc(
    launch: list[str], tiny, masks: Path, out: Path, *overrides: str, shim: bool = True
) -> subprocess.CompletedProcess:
    script = [str(HELPERS / "accelerate_cpu_fsdp.py"), "-m"] if shim else ["-m"]
    cmd = [
        ACCELERATE, "launch", *launch, *LAUNCH_2, *script, "lacuna_unlearn.trainer.app",
        "method=grad_diff", "restrict=forget_mask", f"model={tiny.model_dir}", f"data={tiny.data_dir}",
        f"masks={masks}", "field=email", "trainer.args.max_steps=2", "trainer.args.per_device_train_batch_size=2",
        "trainer.args.learning_rate=3e-3", f"output_dir={out}", *overrides,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent, env=_env(), timeout=600)


def _cpu_fsdp(version: int) -> list[str]:
    """accelerate's FSDP flags that pass its CPU checks (``sync_module_states`` wants a GPU device)."""
    return [
        "--use_fsdp", "--fsdp_version", str(version), "--fsdp_sync_module_states", "false",
        "--fsdp_cpu_ram_efficient_loading", "false",
    ]  # fmt: skip


def _moved(tiny, masks_path: Path, out: Path) -> tuple[int, int]:
    """(in-mask scalars that moved, out-of-mask scalars that moved), bitwise, from the saved checkpoint."""
    from safetensors.torch import load_file

    from lacuna_metrics.masks import load_masks

    masks = load_masks(masks_path)
    before = load_file(str(tiny.model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert set(before) == set(after)
    inside = outside = 0
    for name, old in before.items():
        changed = old.view(torch.int32) != after[name].view(torch.int32)
        if name in masks.packed:
            keep = masks.forget_mask(name).reshape(old.shape)
            inside += int(changed[keep].sum())
            outside += int(changed[~keep].sum())
        else:
            outside += int(changed.sum())
    return inside, outside


def test_fsdp2_restriction_is_exact_on_sharded_parameters(tiny_lacuna, fsdp_masks, tmp_path):
    out = tmp_path / "fsdp2"
    proc = _unlearn_2proc(
        _cpu_fsdp(2),
        tiny_lacuna,
        fsdp_masks,
        out,
        "trainer.args.gradient_accumulation_steps=2",  # FSDP2 no_sync micro-steps, then reduce-scatter
        "trainer.args.weight_decay=0.01",  # restricted parameters must still get 0
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["distributed"] == {"type": "FSDP", "fsdp_version": 2, "fsdp_requested": True, "processes": 2}
    assert manifest["steps"] == 2 and manifest["out_of_mask_unchanged"] is True  # checked on gathered weights
    inside, outside = _moved(tiny_lacuna, fsdp_masks, out)
    assert outside == 0
    assert inside > 0.9 * manifest["restriction"]["trainable_scalars"]
    assert not (tmp_path / "fsdp2.partial").exists()


def test_fsdp1_refuses_a_restriction_before_training(tiny_lacuna, fsdp_masks, tmp_path):
    out = tmp_path / "fsdp1"
    proc = _unlearn_2proc(_cpu_fsdp(1), tiny_lacuna, fsdp_masks, out)
    assert proc.returncode != 0
    assert "cannot be exact under FSDP1" in proc.stderr and "--fsdp_version 2" in proc.stderr
    assert "'loss'" not in proc.stdout + proc.stderr  # no training step was logged
    assert not out.exists() and not (tmp_path / "fsdp1.partial").exists()


def test_stock_fsdp_on_cpu_runs_ddp_and_says_so(tiny_lacuna, fsdp_masks, tmp_path):
    """accelerate 1.15 keeps a CPU job MULTI_CPU (DDP) even with --use_fsdp. If this starts failing because
    the manifest says FSDP, accelerate shards on CPU: drop tests/helpers/accelerate_cpu_fsdp.py and docs' caveat."""
    out = tmp_path / "stock"
    proc = _unlearn_2proc(_cpu_fsdp(2), tiny_lacuna, fsdp_masks, out, shim=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    expected = {"type": "MULTI_CPU", "fsdp_version": None, "fsdp_requested": True, "processes": 2}
    assert manifest["distributed"] == expected
    assert "replicated, not sharded" in proc.stderr
    inside, outside = _moved(tiny_lacuna, fsdp_masks, out)
    assert outside == 0 and inside > 0
