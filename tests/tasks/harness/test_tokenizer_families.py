"""Memorization metrics on real tokenizer families, through lm-eval itself.

* ``sentencepiece``: the Llama / Mistral v1 SentencePiece model (32k) shipped in ``mistral-common``
  (``mistral_common/data/tokenizer.model.v1``), converted to a HF tokenizer by transformers
  (``sentencepiece`` + ``protobuf``); ``sentencepiece-legacy`` is the same model in the
  normalizer-based layout of the Llama-2 / Mistral-7B-v0.1 ``tokenizer.json`` files.
* ``tekken``: Mistral's tiktoken-style BPE (131k, ``tekken_240718.json``), converted by
  ``transformers.integrations.mistral.convert_tekken_tokenizer``.
* ``bytelevel``: a GPT-2 style byte-level BPE trained here on the bundled data.

Each family gets a tiny model (random, then trained a few steps on some answers so that greedy
flags are mixed) saved with its tokenizer; the task pack runs through the real ``lm_eval`` CLI and
EM / ES / Prob are compared with one direct teacher-forced forward pass per document.
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

from lacuna_tasks.harness.hooks import LmEvalEncoding, build_docs, token_plan
from lacuna_tasks.loader import load_data

FAMILIES = ("sentencepiece", "tekken", "bytelevel")
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


def _mistral_common_file(name: str) -> Path:
    mistral_common = pytest.importorskip("mistral_common")
    path = Path(mistral_common.__file__).parent / "data" / name
    if not path.is_file():
        pytest.skip(f"mistral-common has no {name}")
    return path


def _sentencepiece_tokenizer(tmp: Path, legacy: bool = False):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")
    from transformers import LlamaTokenizer

    src = tmp / "sp_model"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_mistral_common_file("tokenizer.model.v1"), src / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(src, add_bos_token=True)  # converted via sentencepiece + protobuf
    if legacy:  # Llama-2 / Mistral-7B-v0.1 tokenizer.json: the spaces handled by the normalizer
        from tokenizers import normalizers

        backend = tok.backend_tokenizer
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        backend.pre_tokenizer = None
    return tok


def _tekken_tokenizer():
    try:
        from transformers.integrations.mistral import convert_tekken_tokenizer
    except ImportError:
        pytest.skip("this transformers cannot convert tekken tokenizers")

    tok = convert_tekken_tokenizer(str(_mistral_common_file("tekken_240718.json")))
    tok.add_bos_token = True  # as Mistral's published HF tokenizers do
    return tok


def _bytelevel_tokenizer():
    """GPT-2 style: byte-level BPE with GPT-2's pre-tokenizer regex, no BOS, ``<|endoftext|>`` as EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    data = load_data(None)
    texts = [f"Q: {r['question']}\nA: {r['answer']}\n" for side in ("forget", "retain") for r in data.splits[side]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def make_tokenizer(family: str, tmp: Path):
    if family == "sentencepiece":
        return _sentencepiece_tokenizer(tmp)
    if family == "sentencepiece-legacy":
        return _sentencepiece_tokenizer(tmp, legacy=True)
    if family == "tekken":
        return _tekken_tokenizer()
    if family == "bytelevel":
        return _bytelevel_tokenizer()
    raise ValueError(family)


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


# --------------------------------------------------------------------------- the conversions are faithful


def test_converted_tokenizers_match_their_reference_implementations(tmp_path):
    """HF conversions encode like sentencepiece / mistral-common themselves on the bundled QA text."""
    pytest.importorskip("sentencepiece")
    import sentencepiece
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    data = load_data(None)
    texts = [f"Q: {r['question']}\nA: {r['answer']}" for r in data.splits["forget"][:200]]
    spm = sentencepiece.SentencePieceProcessor(model_file=str(_mistral_common_file("tokenizer.model.v1")))
    for family in ("sentencepiece", "sentencepiece-legacy"):
        tok = make_tokenizer(family, tmp_path)
        for text in texts:
            assert tok.encode(text) == [tok.bos_token_id, *spm.encode(text)], (family, text)
    tekken = Tekkenizer.from_file(str(_mistral_common_file("tekken_240718.json")))
    tok = make_tokenizer("tekken", tmp_path)
    for text in texts:
        assert tok.encode(text) == tekken.encode(text, bos=True, eos=False), text


# --------------------------------------------------------------------------- request plans on all bundled rows


@pytest.mark.parametrize("family", [*FAMILIES, "sentencepiece-legacy"])
def test_plans_are_exact_and_safe_on_bundled_data(family, tmp_path):
    """Every forget/retain row of the bundled data (800): no ``token_mismatch``, and every request reaches
    lm-eval's real ``HFLM`` tokenization as planned (non-empty continuations, the intended tokens)."""
    from lm_eval.models.huggingface import HFLM
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer(family, tmp_path)
    tiny = LlamaForCausalLM(
        LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1)
    )
    lm = HFLM(pretrained=tiny, tokenizer=tokenizer, device="cpu", batch_size=1)
    encoding = LmEvalEncoding(lm.tokenizer)
    data = load_data(None)
    fields = sorted({r["field"] for side in ("forget", "retain") for r in data.splits[side]})
    docs = [
        d
        for side in ("forget", "retain")
        for field in fields
        for d in build_docs(data, field=field, side=side, kind="memorization")
    ]
    assert len(docs) == len(data.splits["forget"]) + len(data.splits["retain"])
    flagged, generation = 0, 0
    for doc in docs:
        plan = token_plan(encoding, doc["prompt"], doc["answer"])
        flagged += plan.mismatch
        whole = lm.tok_encode(doc["prompt"] + doc["answer"])
        first = len(whole) - len(plan.answer_ids)
        assert whole[first:] == plan.answer_ids
        for t, slot in enumerate(plan.slots):
            assert slot.request is not None
            request_type, (context, continuation) = plan.requests[slot.request]
            ctx, cont = lm._encode_pair(context, continuation)  # lm-eval's own code
            assert cont, (family, doc["answer"], context[-10:], continuation)
            assert ctx + cont == whole[: first + t + 1] and len(cont) == slot.covers
            if slot.generation is not None:
                generation += 1
                gen_context, gen_kwargs = plan.requests[slot.generation][1]
                assert lm.tok_batch_encode([gen_context])[0][0].tolist() == whole[: first + t]
                assert gen_kwargs["max_gen_toks"] == 1
                assert lm.tok_decode([whole[first + t]]) == slot.expected
        eos_ctx, eos_cont = lm._encode_pair(*plan.requests[plan.eos_request][1])
        assert eos_ctx == whole and eos_cont == [lm.tokenizer.eos_token_id]
    assert flagged == 0, f"{family}: {flagged}/{len(docs)} documents flagged"
    if family == "tekken":  # digits never carry the space before them: phone numbers need the generation path
        assert generation > 0


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


@pytest.mark.parametrize("family", [*FAMILIES, "sentencepiece-legacy"])
def test_unlearning_labels_are_the_tokens_the_evaluation_scores(family, tmp_path):
    """Every forget/retain row of the bundled data: the unlearning sequence's prompt is the one lm-eval feeds the model
    (its BOS included), and the unlearning loss's target (``encode_qa``) starts with exactly
    the answer tokens the memorization metrics score through lm-eval (``token_plan``), then the newline and EOS; the
    refusals of IdkDPO and JensUn and AlphaEdit's target are their tokens after a probe prompt. Tokenized alone, the Llama-2 layout
    (``sentencepiece-legacy``) gave `` answer`` a stray ``▁▁`` the model never sees after ``A:``."""
    from lacuna_tasks.prompts import probe_prompt, qa_prompt
    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.methods.alpha_edit.edit import EditRequest, _target_ids
    from lacuna_unlearn.trainer.unlearn_data import encode_qa

    tokenizer = make_tokenizer(family, tmp_path)
    encoding = LmEvalEncoding(tokenizer)
    data = load_data(None)
    rows = [r for side in ("forget", "retain") for r in data.splits[side]]
    for row in rows:
        item = encode_qa(tokenizer, row["question"], row["answer"])
        prompt_part = item["input_ids"][item["labels"] == -100].tolist()
        assert prompt_part == encoding.encode(probe_prompt(row["question"])), (family, "prompt")  # BOS as lm-eval
        target = item["input_ids"][item["labels"] != -100].tolist()
        plan = token_plan(encoding, qa_prompt(row["question"]), row["answer"])  # as the memorization docs
        assert target[: len(plan.answer_ids)] == plan.answer_ids, (family, row["answer"])
        assert target[-1] == tokenizer.eos_token_id
    prompt = probe_prompt(rows[0]["question"])
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    alpha_edit = EditRequest(prompt=prompt, subject=rows[0]["question"], target="No idea")
    for name, text in (("idk_dpo", " I don't know.\n"), ("jensun", " No idea"), ("alpha_edit", " No idea\n")):
        if name == "alpha_edit":
            ids = _target_ids(tokenizer, alpha_edit)
        else:
            method = make_method(name)
            method.prepare(tokenizer)
            ids = list(method.refusal_ids)
        whole = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        assert whole[: len(head)] == head
        assert ids[: len(whole) - len(head)] == whole[len(head) :], (family, name)


@pytest.mark.parametrize("family", ["sentencepiece", "tekken"])
def test_unlearning_trains_with_the_bos_of_the_tokenizer(family, family_dirs, tmp_path):
    """A real ``Trainer`` run of IdkDPO (labels, its refusal side built from them, a reference model) on a tiny model
    whose tokenizer adds a BOS: the manifest records it before every prompt, and the weights move."""
    import json

    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.trainer.loop import TrainConfig, unlearn
    from lacuna_unlearn.trainer.unlearn_data import split_rows

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


@pytest.mark.parametrize("family", [*FAMILIES, "sentencepiece-legacy"])
def test_alpha_edit_reads_prompts_as_the_tokenizer_encodes_them(family, tmp_path):
    """AlphaEdit's prompt ids are the tokenizer's own encoding (its BOS included), and the subject's last token is
    found in them: decoding up to it ends with the subject."""
    from lacuna_unlearn.methods.alpha_edit.edit import encode, lookup_token

    tokenizer = make_tokenizer(family, tmp_path)
    text = "Q: Ann Lee, who lives in Paris. What is her Email Address?\nA:"
    ids = encode(tokenizer, text)
    assert ids == tokenizer(text)["input_ids"], family
    idx = lookup_token(tokenizer, text, "Ann Lee")
    assert tokenizer.decode(ids[: idx + 1], skip_special_tokens=True).endswith("Ann Lee"), family
    assert lookup_token(tokenizer, text, "Ann Lee", "last") == len(ids) - 1
