"""The one QA encoding (prompt + answer -> ``input_ids``/``labels``, loss on the answer only) and its collator.

Two callers with two historical rules, kept through explicit :class:`QAFormat` settings (docs/unlearning.md):

* unlearning and relearning (:mod:`lacuna_unlearn.qa.unlearn_data`, :data:`UNLEARN_FORMAT`): the tokenizer's leading
  special tokens (BOS), the prompt, then the answer as it continues the prompt (:func:`continuation_ids`); EOS is appended to the answer if missing (and only if the tokenizer
  has one); the prompt's left end is truncated and an answer that does not fit is an error.
* QA tuning of a testbed (:mod:`lacuna_unlearn.testbed.qa_tuning`, :data:`QA_TUNING_FORMAT`): prompt + answer are tokenized
  as one text with the tokenizer's special tokens, the prompt's labels are masked up to the length of the prompt
  tokenized alone (its trailing space stripped: the space joins the answer's first token); EOS is always appended;
  the sequence's right end is truncated.

:func:`pad_qa` right-pads a list of encoded items; :class:`QACollator` pads flat lists and the nested
``{"forget": item, "retain": item, ...}`` items of the unlearning datasets with the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "IGNORE_INDEX",
    "QA_TUNING_FORMAT",
    "UNLEARN_FORMAT",
    "QACollator",
    "QAFormat",
    "continuation_ids",
    "encode_pair",
    "eos_appended",
    "leading_special_ids",
    "pad_qa",
    "with_answer",
]

IGNORE_INDEX = -100


@dataclass(frozen=True)
class QAFormat:
    """How a (prompt, answer) pair is tokenized and labelled.

    ``joint``: tokenize prompt + answer as one text (else the prompt alone, then the answer's
    :func:`continuation_ids`). ``special_tokens``: let the tokenizer add its special tokens (BOS); tokenized apart,
    only those it puts before the prompt (:func:`leading_special_ids`). ``eos``: ``"if_missing"`` (append the tokenizer's EOS unless the answer
    already ends with it; none when the tokenizer has no EOS), ``"always"`` or ``"none"``. ``truncation``:
    ``"prompt_left"`` (cut the prompt's left end; the answer is kept whole or the pair refused) or ``"right"``
    (cut the sequence's right end)."""

    max_length: int = 256
    joint: bool = False
    special_tokens: bool = False
    eos: str = "if_missing"
    truncation: str = "prompt_left"

    def __post_init__(self) -> None:
        if self.eos not in ("if_missing", "always", "none"):
            raise ValueError(f"QAFormat.eos={self.eos!r}: expected if_missing, always or none")
        if self.truncation not in ("prompt_left", "right"):
            raise ValueError(f"QAFormat.truncation={self.truncation!r}: expected prompt_left or right")


#: Unlearning/relearning labels (OpenUnlearning and LACUNA: BOS as the tokenizer adds it, the answer plus EOS,
#: docs/unlearning.md).
UNLEARN_FORMAT = QAFormat(special_tokens=True)
#: QA tuning of a testbed (docs/definitions.md#qa-tuning).
QA_TUNING_FORMAT = QAFormat(joint=True, special_tokens=True, eos="always", truncation="right")


def eos_appended(tokenizer: Any, append_eos: bool = True) -> bool:
    """Whether the unlearning encoding ends the labelled target with EOS: asked for, and the tokenizer has one."""
    return bool(append_eos) and getattr(tokenizer, "eos_token_id", None) is not None


def _ids(tokenizer: Any, text: str, special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special_tokens)["input_ids"])


def continuation_ids(tokenizer: Any, prompt: str, text: str) -> list[int]:
    """The tokens of ``text`` as it continues ``prompt`` (no special tokens): the tail of ``prompt + text`` tokenized
    as one text when ``prompt`` alone tokenizes to its head (lm-eval's continuation), else ``text`` tokenized alone.

    Why not always alone: a SentencePiece layout that prepends ``▁`` to every text it encodes (the Llama-2 /
    Mistral-7B-v0.1 ``tokenizer.json``) turns a lone `` answer`` into ``▁▁`` + ``answer``, tokens the model never
    sees after a prompt and the evaluation never scores (docs/unlearning.md). Elsewhere both agree."""
    return _continuation(tokenizer, prompt, _ids(tokenizer, prompt, False), text)


def _continuation(tokenizer: Any, prompt: str, head: list[int], text: str) -> list[int]:
    """:func:`continuation_ids` given ``head``, the prompt's own tokens."""
    whole = _ids(tokenizer, prompt + text, False)
    if len(whole) > len(head) and whole[: len(head)] == head:
        return whole[len(head) :]
    return _ids(tokenizer, text, False)


def leading_special_ids(tokenizer: Any, text: str) -> list[int]:
    """The special tokens the tokenizer puts before ``text`` (BOS for Llama/Mistral, none for GPT-2-style BPE). A
    special token it appends (an EOS, with ``add_eos_token``) is not part of a prompt and is left out."""
    return _leading(_ids(tokenizer, text, True), _ids(tokenizer, text, False))


def _leading(full: list[int], plain: list[int]) -> list[int]:
    """The tokens of ``full`` (a text tokenized with special tokens) before ``plain`` (the same without)."""
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return full[:k]
    return []


def encode_pair(tokenizer: Any, prompt: str, answer: str, fmt: QAFormat = UNLEARN_FORMAT) -> dict[str, torch.Tensor]:
    """``{"input_ids", "labels"}`` (1-D long tensors) of ``prompt`` followed by ``answer``; labels are
    :data:`IGNORE_INDEX` over the prompt. ``answer`` is taken verbatim (the caller adds its leading space/newline)."""
    if fmt.joint:
        return _encode_joint(tokenizer, prompt, answer, fmt)
    prompt_ids = _ids(tokenizer, prompt, False)
    lead = _leading(_ids(tokenizer, prompt, True), prompt_ids) if fmt.special_tokens else []
    target = _continuation(tokenizer, prompt, prompt_ids, answer)
    if not target:
        raise ValueError(f"answer {answer.strip()!r} tokenizes to nothing")
    eos = getattr(tokenizer, "eos_token_id", None)
    if fmt.eos == "always" or (fmt.eos == "if_missing" and eos is not None and target[-1] != eos):
        target = [*target, _eos_id(tokenizer)]
    if fmt.truncation == "prompt_left":  # the leading special tokens stay: the prompt's text is cut after them
        if len(lead) + len(target) >= fmt.max_length:
            after = f" after {len(lead)} leading special token(s)" if lead else ""
            raise ValueError(f"answer of {len(target)} tokens does not fit max_length={fmt.max_length}{after}")
        prompt_ids = lead + prompt_ids[-(fmt.max_length - len(lead) - len(target)) :]
        ids, labels = prompt_ids + target, [IGNORE_INDEX] * len(prompt_ids) + target
    else:
        prompt_ids = lead + prompt_ids
        ids = (prompt_ids + target)[: fmt.max_length]
        labels = ([IGNORE_INDEX] * len(prompt_ids) + target)[: fmt.max_length]
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}


def _encode_joint(tokenizer: Any, prompt: str, answer: str, fmt: QAFormat) -> dict[str, torch.Tensor]:
    head = prompt.rstrip(" ")  # a trailing space belongs to the answer's first token
    n_prompt = len(_ids(tokenizer, head, fmt.special_tokens))
    ids = _ids(tokenizer, prompt + answer, fmt.special_tokens)
    eos = getattr(tokenizer, "eos_token_id", None)
    if fmt.eos == "always" or (fmt.eos == "if_missing" and eos is not None and (not ids or ids[-1] != eos)):
        ids = [*ids, _eos_id(tokenizer)]
    if fmt.truncation == "prompt_left" and len(ids) > fmt.max_length:
        raise ValueError(f"prompt and answer of {len(ids)} tokens do not fit max_length={fmt.max_length}")
    ids = ids[: fmt.max_length]
    labels = ([IGNORE_INDEX] * n_prompt + ids[n_prompt:])[: len(ids)]
    return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("this QA format ends every answer with EOS, but the tokenizer has no EOS token")
    return int(eos)


def with_answer(item: Mapping[str, torch.Tensor], answer_ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """The same prompt with the answer replaced by ``answer_ids`` (labelled): the prompt is the item's tokens before
    its first labelled one (all of them when nothing is labelled)."""
    if not answer_ids:
        raise ValueError("with_answer: empty answer")
    labelled = (item["labels"] != IGNORE_INDEX).nonzero()
    n_prompt = int(labelled[0]) if len(labelled) else int(item["input_ids"].numel())
    answer = torch.tensor(list(answer_ids), dtype=torch.long)
    prompt = item["input_ids"][:n_prompt].to(torch.long)
    return {
        "input_ids": torch.cat([prompt, answer]),
        "labels": torch.cat([torch.full((n_prompt,), IGNORE_INDEX, dtype=torch.long), answer]),
    }


def pad_qa(items: Sequence[Mapping[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ids with ``pad_id`` and labels with -100; the attention mask comes from the lengths."""
    width = max(int(it["input_ids"].numel()) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, it in enumerate(items):
        n = int(it["input_ids"].numel())
        ids[row, :n], labels[row, :n], mask[row, :n] = it["input_ids"], it["labels"], 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class QACollator:
    """The collator of every QA dataset here: a list of encoded items -> one padded batch (:func:`pad_qa`); a list
    of ``{name: item}`` (the unlearning datasets' ``forget``/``retain``/``forget_alternate``) -> ``{name: batch}``
    for every name of the first element."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = int(pad_id)

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if "input_ids" in batch[0]:
            return pad_qa(batch, self.pad_id)
        return {name: pad_qa([b[name] for b in batch], self.pad_id) for name in batch[0]}
