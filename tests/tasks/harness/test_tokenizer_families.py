"""Memorization metrics on real tokenizer families (tests/helpers/tokenizer_families.py), without lm-eval's CLI.

* ``sentencepiece``: the Llama / Mistral v1 SentencePiece model (32k) shipped in ``mistral-common``
  (``mistral_common/data/tokenizer.model.v1``), converted to a HF tokenizer by transformers
  (``sentencepiece`` + ``protobuf``); ``sentencepiece-legacy`` is the same model in the
  normalizer-based layout of the Llama-2 / Mistral-7B-v0.1 ``tokenizer.json`` files.
* ``tekken``: Mistral's tiktoken-style BPE (131k, ``tekken_240718.json``), converted by
  ``transformers.integrations.mistral.convert_tekken_tokenizer``.
* ``bytelevel``: a GPT-2 style byte-level BPE trained here on the bundled data.

The conversions match their reference implementations; the token plans are exact on the bundled data (against
lm-eval's own encoding); the unlearning labels are the tokens the evaluation scores; AlphaEdit reads prompts as the
tokenizer encodes them. The task pack through the real ``lm_eval`` CLI, and unlearning with each tokenizer's BOS:
tests/e2e/test_tokenizer_families_cli.py.
"""

from __future__ import annotations

import pytest
from helpers.tokenizer_families import (
    FAMILIES,
    _mistral_common_file,
    make_tokenizer,
)

from lacuna_tasks.harness.hooks import LmEvalEncoding, build_docs, token_plan
from lacuna_tasks.loader import load_data

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
    from lacuna_unlearn.qa.unlearn_data import encode_qa

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
