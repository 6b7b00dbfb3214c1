"""Forget/retain QA data for unlearning: LACUNA "Q:/A:" text, loss on the answer tokens only.

Each QA row becomes the probe prompt ``Q: question\\nA:`` (labels -100) followed by the continuation
`` answer\\n`` and the tokenizer's EOS token (labelled), tokenized separately and concatenated, so the answer's
first token is the same one lm-eval scores and the extraction probe generates. The EOS is OpenUnlearning's
(``preprocess_chat_instance``, which LACUNA unlearns with: assistant part ``"A: " + answer + "\\n"``, then EOS
appended if missing; docs/definitions.md#openunlearning-conventions, #qa-templates), so every loss also counts the
end-of-answer prediction. ``append_eos=False`` (config ``append_eos=false``) gives the earlier `` answer\\n``-only
labels; a tokenizer without an EOS token gets none (the trainer's manifest records which). Forget items are paired
with a uniformly random retain item on every access, and one epoch is one pass over the forget set
(OpenUnlearning's ``ForgetRetainDataset`` with ``anchor: forget``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from lacuna_tasks import probe_prompt
from lacuna_unlearn.qa.encoding import (
    IGNORE_INDEX,
    UNLEARN_FORMAT,
    QACollator,
    continuation_ids,
    encode_pair,
    eos_appended,
    with_answer,
)

__all__ = [
    "CROSSFIELD_RETAIN",
    "RETAIN_FIELD_MODES",
    "ForgetRetainDataset",
    "QADataset",
    "answer_ids",
    "check_unlearning_splits",
    "collate_forget_retain",
    "encode_qa",
    "eos_appended",
    "replace_answers",
    "retain_sources",
    "split_rows",
    "unlearning_rows",
    "validate_retain_field",
]


#: ``retain_field`` values besides a field key: ``same`` (the forget field's own retain rows) and ``crossfield``.
RETAIN_FIELD_MODES: tuple[str, ...] = ("same", "crossfield")
#: LACUNA's cross-field unlearning (docs/definitions.md#memorization-test-and-splits, ``docs/unlearning.md``): forget
#: field -> (retain field, whether the retain field's paraphrased rows join too; LACUNA's Email config adds Birth City's
#: paraphrased rows).
CROSSFIELD_RETAIN: dict[str, tuple[str, bool]] = {
    "email": ("birth_city", True),
    "birth_city": ("email", False),
    "phone": ("birth_city", False),
    "drivers_license": ("email", False),
}


def validate_retain_field(value: Any) -> str:
    """``retain_field`` as given, if allowed; ValueError naming the key and the allowed values otherwise."""
    from lacuna_tasks import FIELDS

    allowed = (*RETAIN_FIELD_MODES, *FIELDS)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"retain_field={value!r}: expected one of {', '.join(allowed)}")
    return value


def check_unlearning_splits(**splits: Any) -> None:
    """Refuse a held-out evaluation split (``retain_eval*``) as an unlearning input; ``splits``: config key -> split."""
    from lacuna_tasks import RETAIN_EVAL_SPLITS

    for key, split in splits.items():
        if split in RETAIN_EVAL_SPLITS:
            raise ValueError(
                f"{key}={split}: a held-out evaluation split (its people must stay out of every unlearning input); "
                "use forget / retain"
            )


def retain_sources(data: Any, field: str, retain_field: str, retain_split: str) -> list[tuple[str, str]]:
    """The (split, field) pairs whose rows make up the retain set of a ``field`` run (``field`` may be ``all``).

    ``same``: ``retain_split`` of the forget field(s); a field key: ``retain_split`` of that field; ``crossfield``:
    LACUNA's pairing (:data:`CROSSFIELD_RETAIN`) per forget field, the paired field's ``<retain_split>_paraphrased``
    rows too where LACUNA adds them and the data holds them. Order is stable; no pair twice.
    """
    from lacuna_tasks import FIELDS

    validate_retain_field(retain_field)
    if field != "all" and field not in FIELDS:
        raise ValueError(f"field={field!r}: choose from {sorted(FIELDS)} or 'all'")
    forget_fields = list(FIELDS) if field == "all" else [field]
    if retain_field == "same":
        return [(retain_split, field)]
    if retain_field != "crossfield":
        return [(retain_split, retain_field)]
    out: list[tuple[str, str]] = []
    for key in forget_fields:
        paired, with_paraphrased = CROSSFIELD_RETAIN[key]
        wanted = [(retain_split, paired)]
        if with_paraphrased and f"{retain_split}_paraphrased" in data.splits:
            wanted.append((f"{retain_split}_paraphrased", paired))
        out.extend(pair for pair in wanted if pair not in out)
    return out


def unlearning_rows(
    data: Any,
    *,
    field: str,
    retain_field: str = "same",
    forget_split: str = "forget",
    retain_split: str = "retain",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, str]]]:
    """The forget rows, the retain rows and the retain rows' (split, field) sources of one unlearning run.

    The only place ``lacuna-unlearn`` picks its training rows, so no held-out evaluation row can reach a loss: the
    ``retain_eval`` splits are refused as inputs, and their people are in no forget or retain row by construction
    (``lacuna_tasks.validate`` checks it when the data is loaded).
    """
    check_unlearning_splits(forget_split=forget_split, retain_split=retain_split)
    sources = retain_sources(data, field, retain_field, retain_split)
    forget = split_rows(data, forget_split, field)
    retain = [row for split, fld in sources for row in split_rows(data, split, fld)]
    return forget, retain, sources


def split_rows(data: Any, split: str, field: str) -> list[dict[str, Any]]:
    """Rows of ``split`` for one PII ``field`` (``all``: every field) of a loaded ``LacunaData``; empty is an error."""
    from lacuna_tasks import FIELDS

    if split not in data.splits:
        raise ValueError(f"{data.source}: no split {split!r} (found: {sorted(data.splits)})")
    rows = data.splits[split]
    if field != "all":
        if field not in FIELDS:
            raise ValueError(f"field={field!r}: choose from {sorted(FIELDS)} or 'all'")
        rows = [r for r in rows if r["field"] == FIELDS[field].column]
    if not rows:
        raise ValueError(f"{data.source}: split {split!r} has no rows for field={field!r}")
    return rows


def encode_qa(
    tokenizer: Any, question: str, answer: str, max_length: int = 256, *, append_eos: bool = True
) -> dict[str, torch.Tensor]:
    """Token ids and labels of one QA pair; labels cover `` answer\\n`` and then the tokenizer's EOS (OpenUnlearning
    and LACUNA: the answer plus EOS; none if ``append_eos`` is false or the tokenizer has no EOS token, see
    :func:`eos_appended`). The prompt's left end is truncated; the labelled target is always kept whole
    (:data:`lacuna_unlearn.qa.encoding.UNLEARN_FORMAT`)."""
    fmt = replace(UNLEARN_FORMAT, max_length=max_length, eos="if_missing" if append_eos else "none")
    return encode_pair(tokenizer, probe_prompt(question), f" {answer}\n", fmt)


def answer_ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` tokenized as an answer (no special tokens): as it follows the answer cue ``A:`` that ends every probe
    prompt (:func:`~lacuna_unlearn.qa.encoding.continuation_ids`). For answers that replace the true one (refusals)."""
    return continuation_ids(tokenizer, probe_prompt(""), text)


class QADataset(torch.utils.data.Dataset):
    """Tokenized QA rows (``question`` / ``answer`` keys, the ``lacuna_tasks`` schema) in the unlearning format
    (:func:`encode_qa`), or pre-encoded ``items``."""

    def __init__(
        self,
        rows: Sequence[Mapping[str, Any]],
        tokenizer: Any = None,
        max_length: int = 256,
        name: str = "",
        *,
        append_eos: bool = True,
        items: Sequence[dict[str, torch.Tensor]] | None = None,
    ) -> None:
        if items is not None:
            self.items = list(items)
            return
        if not rows:
            raise ValueError(f"the {name or 'QA'} split is empty")
        self.items = []
        for i, row in enumerate(rows):
            if not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
                raise ValueError(f"{name or 'QA'} row {i}: needs string fields 'question' and 'answer'")
            try:
                item = encode_qa(tokenizer, row["question"], row["answer"], max_length, append_eos=append_eos)
            except ValueError as exc:  # an empty or too long answer: name the row
                raise ValueError(f"{name or 'QA'} row {i} ({row['question'][:60]!r}): {exc}") from None
            self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]

    def with_answer(self, answer_ids: Sequence[int]) -> QADataset:
        """The same prompts, every answer replaced by ``answer_ids`` (IdkDPO's refusal), encoded once."""
        return QADataset((), items=[with_answer(item, answer_ids) for item in self.items])


class ForgetRetainDataset(torch.utils.data.Dataset):
    """``forget[i]`` with a uniformly random ``retain`` item (drawn anew on every access, from torch's RNG,
    which the Trainer seeds); ``len`` is the forget set's, so an epoch is one pass over it. ``alternate[i]``, when
    given, rides along as ``forget_alternate`` (the same prompt with another answer, e.g. IdkDPO's refusal)."""

    def __init__(self, forget: QADataset, retain: QADataset | None, alternate: QADataset | None = None) -> None:
        if alternate is not None and len(alternate) != len(forget):
            raise ValueError(f"alternate answers: {len(alternate)} items for {len(forget)} forget items")
        self.forget, self.retain, self.alternate = forget, retain, alternate

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, i: int) -> dict[str, dict[str, torch.Tensor]]:
        item = {"forget": self.forget[i]}
        if self.alternate is not None:
            item["forget_alternate"] = self.alternate[i]
        if self.retain is not None:
            item["retain"] = self.retain[int(torch.randint(len(self.retain), (1,)))]
        return item


def collate_forget_retain(pad_id: int) -> QACollator:
    """The collator of :class:`ForgetRetainDataset` batches: ``{"forget": {...}, "retain": {...}}``
    (:class:`lacuna_unlearn.qa.encoding.QACollator`)."""
    return QACollator(pad_id)


def replace_answers(batch: Mapping[str, torch.Tensor], answer_ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """The same prompts with every answer replaced by ``answer_ids`` (e.g. a refusal), labelled, right-padded.

    A prompt is a row's tokens before its first labelled one (the layout :func:`encode_qa` produces); pad
    positions get id 0 with attention 0 and label -100.
    """
    if not answer_ids:
        raise ValueError("replace_answers: empty answer")
    rows = []
    for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        labelled = (labels != IGNORE_INDEX).nonzero()
        n_prompt = int(labelled[0]) if len(labelled) else int(batch["attention_mask"][len(rows)].sum())
        rows.append((ids[:n_prompt].tolist(), n_prompt))
    width = max(n + len(answer_ids) for _, n in rows)
    out_ids = torch.zeros((len(rows), width), dtype=torch.long)
    out_labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    answer = torch.tensor(list(answer_ids), dtype=torch.long)
    for r, (prompt, n) in enumerate(rows):
        out_ids[r, :n] = torch.tensor(prompt, dtype=torch.long)
        out_ids[r, n : n + len(answer)] = answer
        out_labels[r, n : n + len(answer)] = answer
        mask[r, : n + len(answer)] = 1
    device = batch["input_ids"].device
    return {"input_ids": out_ids.to(device), "attention_mask": mask.to(device), "labels": out_labels.to(device)}
