"""Memorization metrics on real tokenizer families, through lm-eval itself (tokenizers: tests/helpers/tokenizer_families.py;
the token plans and labels without lm-eval's CLI: tests/tasks/harness/test_tokenizer_families.py).

Each family gets a tiny model (random, then trained a few steps on some answers so that greedy
flags are mixed) saved with its tokenizer; the task pack runs through the real ``lm_eval`` CLI and
EM / ES / Prob are compared with one direct teacher-forced forward pass per document; unlearning trains with the
tokenizer's BOS.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.tokenizer_families import (
    FAMILIES,
    make_tokenizer,
)

from lacuna_tasks.harness.hooks import build_docs
from lacuna_tasks.loader import load_data

LIMIT = 6  # --limit of the CLI runs: docs per task
CLI_TASKS = "lacuna_email,lacuna_phone_forget_memorization,lacuna_phone_retain_memorization"
FIELD_TASKS = [
    f"lacuna_email_{name}"
    for name in (
        "forget_qa",
        "retain_qa",
        "forget_paraphrase",
        "retain_paraphrase",
        "forget_icr",
        "retain_icr",
        "forget_worstcase",
        "forget_memorization",
        "retain_memorization",
    )
]
MEMORIZATION_TASKS = [
    ("email", "forget"),
    ("email", "retain"),
    ("phone", "forget"),
    ("phone", "retain"),
]


def _tiny_model(family: str, tokenizer):
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
    )

    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    if family == "bytelevel":
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=1,
            n_head=2,
            n_positions=512,
            bos_token_id=bos,
            eos_token_id=eos,
        )
        return GPT2LMHeadModel(config)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=True,
    )
    if family == "tekken":
        return MistralForCausalLM(MistralConfig(**common))
    return LlamaForCausalLM(LlamaConfig(**common))


def _teacher_forced(tokenizer, prompt: str, answer: str) -> tuple[list[int], int]:
    """(prompt + answer + EOS token ids, index of the first answer token): lm-eval's split of (prompt, answer)."""
    ctx = tokenizer.encode(prompt.rstrip())
    ids = tokenizer.encode(prompt + answer)
    assert ids[: len(ctx)] == ctx, (prompt, answer)
    return ids + [tokenizer.eos_token_id], len(ctx)


def _partially_memorize(model, tokenizer, docs, steps: int = 20, lr: float = 5e-2) -> None:
    """A few full-batch Adam steps on the answer tokens of ``docs`` (some get memorized, some half)."""
    import torch
    import torch.nn.functional as F

    seqs = [_teacher_forced(tokenizer, d["prompt"], d["answer"]) for d in docs]
    width = max(len(ids) for ids, _ in seqs)
    # right padding: a causal model's positions before the padding do not see it
    batch = torch.tensor([ids + [tokenizer.eos_token_id] * (width - len(ids)) for ids, _ in seqs])
    rows = torch.tensor([i for i, (ids, start) in enumerate(seqs) for _ in range(start, len(ids))])
    cols = torch.tensor([t - 1 for ids, start in seqs for t in range(start, len(ids))])
    targets = torch.tensor([ids[t] for ids, start in seqs for t in range(start, len(ids))])
    head = model.get_output_embeddings()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        hidden = model.base_model(batch).last_hidden_state[rows, cols]  # logits only at answer positions
        F.cross_entropy(head(hidden), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def memorization_docs(field: str, side: str, limit: int | None = None) -> list[dict]:
    """The documents of ``lacuna_{field}_{side}_memorization`` on the bundled data, in task order."""
    docs = build_docs(load_data(None), field=field, side=side, kind="memorization")
    return docs[:limit] if limit else docs


@dataclass
class Family:
    name: str
    model_dir: Path


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory) -> dict[str, Family]:
    """A tiny model + tokenizer directory per family, trained on half of the CLI runs' memorization docs."""
    root = tmp_path_factory.mktemp("tokenizer_families")
    out = {}
    for family in FAMILIES:
        tokenizer = make_tokenizer(family, root / f"{family}_src")
        model = _tiny_model(family, tokenizer)
        train = [d for field, side in MEMORIZATION_TASKS for d in memorization_docs(field, side, LIMIT)[::2]]
        _partially_memorize(model, tokenizer, train)
        model_dir = root / family
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        out[family] = Family(family, model_dir)
    return out


# --------------------------------------------------------------------------- the real lm_eval CLI


def direct_memorization(model, tokenizer, prompt: str, answer: str) -> dict[str, float]:
    """EM / ES / Prob from one teacher-forced forward pass (independent of the task code)."""
    import torch

    ids, start = _teacher_forced(tokenizer, prompt, answer)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    targets = ids[start:]
    preds = [int(logits[start + t - 1].argmax()) for t in range(len(targets))]
    lps = [float(logp[start + t - 1, y]) for t, y in enumerate(targets)]
    m = len(targets) - 1  # EOS is scored in Prob only
    em = sum(p == y for p, y in zip(preds[:m], targets[:m], strict=True)) / m
    k = next((k for k in range(m) if preds[k:m] == targets[k:m]), m - 1)
    return {"em": em, "es": 1 - k / m, "prob": math.exp(sum(lps) / len(lps))}


def run_cli(model_dir: Path, out: Path, tasks: str, limit: int | None) -> dict:
    exe = Path(sys.executable).with_name("lm_eval")
    cmd = [
        str(exe) if exe.exists() else shutil.which("lm_eval"),
        "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32",
        "--tasks", tasks,
        "--device", "cpu",
        "--batch_size", "16",
        "--output_path", str(out),
        "--log_samples",
        *(["--limit", str(limit)] if limit else []),
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results_file = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    samples = defaultdict(list)
    for file in results_file.parent.glob("samples_*.jsonl"):
        task = file.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines()]
    return {"results": json.loads(results_file.read_text())["results"], "samples": samples}


def compare_with_direct(model_dir: Path, samples: dict[str, list[dict]]) -> dict[str, float]:
    """Max |task value - direct value| per metric over all memorization samples, plus path counts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    worst = {"em": 0.0, "es": 0.0, "prob": 0.0, "docs": 0, "generation_requests": 0, "greedy_tokens": 0}
    for task, rows in samples.items():
        if not task.endswith("_memorization"):
            continue
        for s in rows:
            direct = direct_memorization(model, tokenizer, s["doc"]["prompt"], s["doc"]["answer"])
            for metric in ("em", "es", "prob"):
                worst[metric] = max(worst[metric], abs(s[metric] - direct[metric]))
            assert s["token_mismatch"] == 0.0, (task, s["doc"]["answer"])
            worst["docs"] += 1
            arguments = s["arguments"].values() if isinstance(s["arguments"], dict) else s["arguments"]
            worst["generation_requests"] += sum(isinstance(list(a.values())[1], dict) for a in arguments)
            worst["greedy_tokens"] += direct["em"] > 0
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_field_pack_through_lm_eval_cli(family, family_dirs, tmp_path):
    """``lm_eval --tasks lacuna_email`` (nine tasks) + phone memorization: no crash, every metric reported,
    no ``token_mismatch``, and EM / ES / Prob equal to the direct teacher-forced computation."""
    model_dir = family_dirs[family].model_dir
    run = run_cli(model_dir, tmp_path / "out", CLI_TASKS, LIMIT)
    for task in FIELD_TASKS:
        assert task in run["results"], f"{task} missing"
    for field, side in MEMORIZATION_TASKS:
        res = run["results"][f"lacuna_{field}_{side}_memorization"]
        for metric in ("em", "es", "prob"):
            assert not math.isnan(res[f"{metric},none"])
        assert res["token_mismatch,none"] == 0.0
    worst = compare_with_direct(model_dir, run["samples"])
    assert worst["docs"] == LIMIT * len(MEMORIZATION_TASKS)
    assert worst["em"] < 1e-12 and worst["es"] < 1e-12, worst
    assert worst["prob"] < 1e-5, worst
    assert worst["greedy_tokens"] > 0, "the tiny model should have memorized some answer tokens"
    if family == "tekken":
        assert worst["generation_requests"] > 0


ALL_MEMORIZATION_TASKS = ",".join(
    f"lacuna_{field}_{side}_memorization"
    for field in ("email", "phone", "birth_city", "drivers_license")
    for side in ("forget", "retain")
)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("LACUNA_FULL_MEMORIZATION_CHECK"),
    reason="opt-in (LACUNA_FULL_MEMORIZATION_CHECK=1): all 800 bundled forget/retain rows per family, minutes each",
)
@pytest.mark.parametrize("family", FAMILIES)
def test_memorization_exact_on_all_bundled_rows(family, family_dirs, tmp_path):
    """The eight memorization tasks on every bundled forget/retain row, compared with direct computation."""
    model_dir = family_dirs[family].model_dir
    run = run_cli(model_dir, tmp_path / "out", ALL_MEMORIZATION_TASKS, None)
    worst = compare_with_direct(model_dir, run["samples"])
    print(json.dumps({family: worst}))
    data = load_data(None)
    assert worst["docs"] == len(data.splits["forget"]) + len(data.splits["retain"])
    assert worst["em"] < 1e-12 and worst["es"] < 1e-12 and worst["prob"] < 1e-5, worst


@pytest.mark.parametrize("family", ["sentencepiece", "tekken"])
def test_unlearning_trains_with_the_bos_of_the_tokenizer(family, family_dirs, tmp_path):
    """A real ``Trainer`` run of IdkDPO (labels, its refusal side built from them, a reference model) on a tiny model
    whose tokenizer adds a BOS: the manifest records it before every prompt, and the weights move."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.qa.unlearn_data import split_rows
    from lacuna_unlearn.trainer.loop import TrainConfig, unlearn

    model_dir = family_dirs[family].model_dir
    bos = AutoTokenizer.from_pretrained(model_dir).bos_token_id
    data = load_data(None)
    forget, retain = split_rows(data, "forget", "email")[:8], split_rows(data, "retain", "email")[:8]
    out = unlearn(
        model_dir, forget, retain, make_method("idk_dpo"), tmp_path / "idk",
        train=TrainConfig(learning_rate=1e-3, max_steps=2, per_device_train_batch_size=4),
    )  # fmt: skip
    manifest = json.loads((Path(out) / "unlearn_manifest.json").read_text())
    assert bos is not None and manifest["labels"]["leading_special_ids"] == [bos]
    before, after = load_file(model_dir / "model.safetensors"), load_file(Path(out) / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
