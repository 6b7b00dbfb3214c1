"""Unlearning labels (``lacuna_unlearn.qa.unlearn_data.encode_qa``): the answer `` answer\\n`` followed by the
tokenizer's EOS, as OpenUnlearning's ``preprocess_chat_instance`` builds them for LACUNA
(``docs/definitions.md#openunlearning-conventions``); prompt tokens -100; the target is never truncated;
``append_eos=False`` gives the earlier labels; a tokenizer without an EOS token gets none. A tokenizer trained here, no
model."""

from __future__ import annotations

import pytest
import torch

from lacuna_tasks.prompts import probe_prompt
from lacuna_unlearn.methods.losses import token_counts
from lacuna_unlearn.qa.unlearn_data import (
    IGNORE_INDEX,
    QADataset,
    collate_forget_retain,
    encode_qa,
    eos_appended,
)

QUESTION = "What is the email address of Ann Lee, who was born in Lyon?"
ANSWER = "ann.lee@example.com"


@pytest.fixture(scope="module")
def tok():
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    corpus = [probe_prompt(QUESTION) + f" {ANSWER}\n", "Q: Where was Bob born?\nA: Paris\n"] * 20
    return train_tokenizer(corpus, vocab_size=300)


@pytest.fixture(scope="module")
def tok_without_eos(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)  # same vocabulary, no special tokens


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_labels_are_the_answer_then_eos(tok):
    item = encode_qa(tok, QUESTION, ANSWER)
    ids, labels = item["input_ids"].tolist(), item["labels"].tolist()
    prompt, answer = _ids(tok, probe_prompt(QUESTION)), _ids(tok, f" {ANSWER}\n")
    assert ids == prompt + answer + [tok.eos_token_id]
    assert labels == [IGNORE_INDEX] * len(prompt) + answer + [tok.eos_token_id]
    assert labels[-1] == tok.eos_token_id and tok.decode(answer) == f" {ANSWER}\n"  # EOS after the newline
    assert eos_appended(tok) and not eos_appended(tok, append_eos=False)


def test_option_off_reproduces_the_earlier_labels(tok):
    item = encode_qa(tok, QUESTION, ANSWER, append_eos=False)
    prompt, answer = _ids(tok, probe_prompt(QUESTION)), _ids(tok, f" {ANSWER}\n")
    assert item["input_ids"].tolist() == prompt + answer
    assert item["labels"].tolist() == [IGNORE_INDEX] * len(prompt) + answer
    data = QADataset([{"question": QUESTION, "answer": ANSWER}], tok, append_eos=False)
    assert torch.equal(data[0]["labels"], item["labels"])


def test_truncation_keeps_the_whole_target_with_eos(tok):
    answer = _ids(tok, f" {ANSWER}\n")
    target = len(answer) + 1
    item = encode_qa(tok, QUESTION, ANSWER, max_length=target + 3)  # room for 3 prompt tokens only
    labels = item["labels"].tolist()
    assert len(labels) == target + 3 and labels[:3] == [IGNORE_INDEX] * 3
    assert labels[3:] == answer + [tok.eos_token_id]
    assert item["input_ids"].tolist()[:3] == _ids(tok, probe_prompt(QUESTION))[-3:]  # the prompt's left end goes
    with pytest.raises(ValueError, match="does not fit max_length"):
        encode_qa(tok, QUESTION, ANSWER, max_length=target)  # EOS counts towards the target
    assert encode_qa(tok, QUESTION, ANSWER, max_length=target, append_eos=False)["labels"].tolist()[-1] != (
        tok.eos_token_id
    )


def _with_post_processor(tok, template: str):
    """``tok`` whose special tokens follow ``template`` (``<|endoftext|>`` standing in for a BOS or an EOS)."""
    import copy

    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = copy.deepcopy(tok.backend_tokenizer)
    backend.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[("<|endoftext|>", tok.eos_token_id)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=tok.eos_token, pad_token=tok.pad_token)


def test_a_bos_the_tokenizer_adds_starts_the_sequence_and_survives_truncation(tok):
    """As OpenUnlearning tokenizes (``add_special_tokens=True``) and lm-eval scores: the tokenizer's BOS comes first,
    unlabelled; a long prompt is cut after it. A special token appended after the text is not a prompt's."""
    from lacuna_unlearn.qa.encoding import leading_special_ids

    bos_tok, bos = _with_post_processor(tok, "<|endoftext|> $A"), tok.eos_token_id
    prompt, answer = _ids(tok, probe_prompt(QUESTION)), _ids(tok, f" {ANSWER}\n")
    assert leading_special_ids(bos_tok, probe_prompt(QUESTION)) == [bos]
    item = encode_qa(bos_tok, QUESTION, ANSWER)
    assert item["input_ids"].tolist() == [bos, *prompt, *answer, bos]
    assert item["labels"].tolist() == [IGNORE_INDEX] * (1 + len(prompt)) + answer + [bos]
    cut = encode_qa(bos_tok, QUESTION, ANSWER, max_length=len(answer) + 4)  # BOS, 2 prompt tokens, the target
    assert cut["input_ids"].tolist() == [bos, *prompt[-2:], *answer, bos]
    with pytest.raises(ValueError, match="does not fit max_length"):
        encode_qa(bos_tok, QUESTION, ANSWER, max_length=len(answer) + 2)
    assert leading_special_ids(_with_post_processor(tok, "$A <|endoftext|>"), probe_prompt(QUESTION)) == []


def test_tokenizer_without_eos_gets_no_eos(tok, tok_without_eos):
    assert tok_without_eos.eos_token_id is None and not eos_appended(tok_without_eos)
    item = encode_qa(tok_without_eos, QUESTION, ANSWER)
    assert item["labels"].tolist() == encode_qa(tok, QUESTION, ANSWER, append_eos=False)["labels"].tolist()


def test_losses_count_the_eos_label(tok):
    """Every loss reads the collated labels: the EOS is one more labelled token per row, and padding stays -100."""
    rows = [{"question": QUESTION, "answer": ANSWER}, {"question": "Where was Bob born?", "answer": "Paris"}]
    with_eos = QADataset(rows, tok, name="forget")
    without = QADataset(rows, tok, name="forget", append_eos=False)
    collate = collate_forget_retain(tok.pad_token_id)
    a = collate([{"forget": x} for x in with_eos])["forget"]
    b = collate([{"forget": x} for x in without])["forget"]
    assert torch.equal(token_counts(a["labels"]), token_counts(b["labels"]) + 1)
    for row, item in enumerate(with_eos):
        n = item["labels"].numel()
        assert a["labels"][row, n - 1] == tok.eos_token_id and a["attention_mask"][row, n - 1] == 1
        assert (a["labels"][row, n:] == IGNORE_INDEX).all()


def _old_qa_tuning_item(tokenizer, prompt: str, answer: str, max_len: int) -> tuple[list[int], list[int]]:
    """The QA-tuning encoding as ``lacuna_unlearn.testbed.qa_tuning.QADataset`` computed it before issue 21."""
    head = prompt.rstrip(" ")
    prompt_ids = tokenizer.encode(head)
    ids = (tokenizer.encode(head + prompt[len(head) :] + answer) + [tokenizer.eos_token_id])[:max_len]
    labels = [-100] * len(prompt_ids) + ids[len(prompt_ids) :]
    return ids, labels[: len(ids)]


@pytest.mark.parametrize("max_len", [256, 12])
def test_qa_tuning_keeps_its_own_rule_through_the_shared_encoding(tok, max_len):
    """One encoding for both callers; QA tuning keeps its rule (joint tokenization with special tokens, EOS always,
    right truncation) through QA_TUNING_FORMAT, and the shared collator pads as its own collate did."""
    from lacuna_tasks.prompts import qa_prompt
    from lacuna_unlearn.qa.encoding import QACollator
    from lacuna_unlearn.testbed.qa_tuning import encode_pairs

    pairs = [(qa_prompt(QUESTION), ANSWER), (qa_prompt("Where was Bob born?"), "Paris")]
    items = encode_pairs(tok, pairs, max_len)
    old = [_old_qa_tuning_item(tok, p, a, max_len) for p, a in pairs]
    assert [(it["input_ids"].tolist(), it["labels"].tolist()) for it in items] == old
    batch = QACollator(tok.pad_token_id)(items)
    width = max(len(ids) for ids, _ in old)
    assert batch["input_ids"].shape == (2, width) and batch["attention_mask"].sum(1).tolist() == [
        len(i) for i, _ in old
    ]
    assert batch["labels"][1, len(old[1][0]) :].eq(IGNORE_INDEX).all()


def test_continuation_is_the_answer_in_context_else_the_text_alone(tok):
    """``continuation_ids``: the tail of prompt + text when the prompt alone tokenizes to its head; when a token spans
    the boundary (``Par`` + ``is`` is one ``Pa``, ``ris`` here) the text is tokenized alone."""
    from lacuna_unlearn.qa.encoding import continuation_ids

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    prompt = probe_prompt(QUESTION)
    assert continuation_ids(tok, prompt, f" {ANSWER}\n") == ids(prompt + f" {ANSWER}\n")[len(ids(prompt)) :]
    assert ids("Par" + "is")[: len(ids("Par"))] != ids("Par")  # the boundary is inside a token
    assert continuation_ids(tok, "Par", "is") == ids("is")


def test_a_row_whose_answer_does_not_fit_is_named(tok):
    rows = [{"question": "Where was Bob born?", "answer": "Paris"}, {"question": QUESTION, "answer": ANSWER}]
    with pytest.raises(ValueError, match=r"forget row 1 \('What is the email.*does not fit max_length=8"):
        QADataset(rows, tok, max_length=8, name="forget")
