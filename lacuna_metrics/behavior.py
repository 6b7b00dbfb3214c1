"""Behavioural probes computed directly on an HF model: batched greedy generation and extraction.

Used by the testbed builder's memorization test (spec §1.7) and, later, the resurfacing attack:
greedy decoding of 20 new tokens, a fact counts as extracted under ``lacuna_tasks.normalize``'s rule
(the same rule the lm-eval tasks use).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lacuna_tasks.normalize import fact_produced


@torch.no_grad()
def greedy_generate(
    model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 20, batch_size: int = 64, stop: str = "\n"
) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches, cut at ``stop``), in input order."""
    model.eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[str] = [""] * len(prompts)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            gen = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, text in zip(idx, texts, strict=True):
                out[i] = text.split(stop, 1)[0] if stop else text
    finally:
        tokenizer.padding_side = side
    return out


def extraction_hits(
    model, tokenizer, prompts: Sequence[str], answers: Sequence[str], fields: Sequence[str], **kwargs
) -> list[bool]:
    """Whether each greedy generation produces its answer."""
    if not len(prompts) == len(answers) == len(fields):
        raise ValueError("prompts, answers and fields must have the same length")
    generations = greedy_generate(model, tokenizer, prompts, **kwargs)
    return [fact_produced(a, g, f) for a, g, f in zip(answers, generations, fields, strict=True)]
