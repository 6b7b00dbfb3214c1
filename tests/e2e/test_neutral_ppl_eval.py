"""``lacuna_neutral_ppl``: perplexity of the testbed's held-out neutral text through the real ``lm_eval`` CLI and the
evaluator, on the smoke testbed (file lookup and the ratio rule: tests/tasks/harness/test_neutral_ppl.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lacuna_tasks.harness.perplexity import (
    NEUTRAL_HELDOUT_FILE,
    PPL_METRICS,
    TASK,
    perplexity_ratio,
    read_neutral_heldout,
)


def _lm_eval(model_dir: Path, data: Path, out: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lm_eval")
    cmd = [
        str(exe) if exe.exists() else shutil.which("lm_eval"),
        "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32",
        "--tasks", TASK,
        "--metadata", json.dumps({"lacuna_data": str(data)}),
        "--batch_size", "8",
        "--output_path", str(out),
        "--log_samples",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)


def _results_file(out: Path) -> Path:
    return max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_missing_file_is_one_clear_line(tiny_lacuna, tmp_path):
    """LACUNA data without the held-out slice (here: `lacuna data generate` output): exit 2, one line naming it."""
    proc = _lm_eval(tiny_lacuna.model_dir, tiny_lacuna.data_dir, tmp_path / "out")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("lm_eval: error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert f"no {NEUTRAL_HELDOUT_FILE}" in errors[0] and str(tiny_lacuna.data_dir) in errors[0]
    assert "Traceback" not in proc.stderr


def _direct_loglikelihood(model, tokenizer, text: str) -> float | None:
    """log p(text | prefix token) from one forward pass (None when the text needs several windows)."""
    import torch

    from lacuna_tasks.harness.hooks import LmEvalEncoding

    encoding = LmEvalEncoding(tokenizer)
    ids = [encoding.prefix_token_id, *encoding.encode(text)]
    if len(ids) > model.config.max_position_embeddings:
        return None
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    return float(sum(logp[t - 1, ids[t]] for t in range(1, len(ids))))


@pytest.mark.slow
def test_neutral_ppl_on_the_smoke_testbed(smoke_testbed, tmp_path):
    data = smoke_testbed / "data"
    file = data / NEUTRAL_HELDOUT_FILE
    texts = read_neutral_heldout(file)
    runs = []
    for name in ("one", "two"):
        proc = _lm_eval(smoke_testbed / "model", data, tmp_path / name)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(_results_file(tmp_path / name))
    first, second = (json.loads(p.read_text()) for p in runs)
    res = first["results"][TASK]
    for metric in PPL_METRICS:
        value = res[f"{metric},none"]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (metric, value)
        assert second["results"][TASK][f"{metric},none"] == value, metric  # identical across runs
    assert res["bits_per_byte,none"] == pytest.approx(math.log2(res["byte_perplexity,none"]), rel=1e-9)
    assert res["word_perplexity,none"] > res["byte_perplexity,none"] > 1.0
    assert first["n-samples"][TASK]["effective"] == len(texts)
    provenance = first["configs"][TASK]["metadata"]["lacuna_neutral_heldout"]
    assert provenance["fingerprint"] == "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
    assert provenance["documents"] == len(texts)
    assert perplexity_ratio(runs[0], runs[1]) == 1.0

    # The aggregate is lm-eval's weighted perplexity of the per-document log-likelihoods, and those are the model's.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples_file = next(runs[0].parent.glob(f"samples_{TASK}_*.jsonl"))
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    lls = {s["doc"]["doc_id"]: float(s["filtered_resps"][0]) for s in samples}
    words = sum(len(t.split()) for t in texts)
    assert res["word_perplexity,none"] == pytest.approx(math.exp(-sum(lls.values()) / words), rel=1e-9)
    model = AutoModelForCausalLM.from_pretrained(smoke_testbed / "model", dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(smoke_testbed / "model")
    compared = 0
    for i, text in enumerate(texts):
        direct = _direct_loglikelihood(model, tokenizer, text)
        if direct is not None:
            assert lls[i] == pytest.approx(direct, rel=1e-4, abs=1e-3), i
            compared += 1
    assert compared >= 1


@pytest.mark.slow
def test_ratio_rises_when_the_model_is_damaged(smoke_testbed, tmp_path):
    """Through the Python API (``lacuna_tasks.harness.evaluate``): noise on every weight makes the neutral text less
    likely, so after / before > 1."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lacuna_tasks.harness.evaluate import evaluate

    before = evaluate(smoke_testbed / "model", [TASK], data=smoke_testbed / "data", batch_size=8)
    model = AutoModelForCausalLM.from_pretrained(smoke_testbed / "model", dtype="float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1:
                p.add_(torch.randn(p.shape, generator=generator) * 0.5 * p.std().clamp_min(1e-3))
    damaged = tmp_path / "damaged"
    model.save_pretrained(damaged)
    AutoTokenizer.from_pretrained(smoke_testbed / "model").save_pretrained(damaged)
    after = evaluate(damaged, [TASK], data=smoke_testbed / "data", batch_size=8)
    assert perplexity_ratio(before, after) > 1.05
