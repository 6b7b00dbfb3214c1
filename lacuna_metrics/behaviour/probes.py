"""Behavioural probes computed directly on an HF model: batched greedy generation and extraction.

Used by the testbed builder's memorization test (docs/definitions.md#memorization-test-and-splits) and the resurfacing
attack's extraction probe (docs/definitions.md#extraction-probe-and-leak-rate): greedy decoding of 20 new tokens, a fact
counts as extracted under a judge of :mod:`lacuna_tasks.normalize` (:data:`~lacuna_tasks.normalize.JUDGES`). The default
judge is ``first_line``, the rule the lm-eval tasks use (generation cut at the first newline); ``lacuna`` is LACUNA's
(the whole 20 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lacuna_tasks import DEFAULT_JUDGE, judge_hit, judge_stop

_UNSET = object()


@torch.no_grad()
def greedy_generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 20,
    batch_size: int = 64,
    stop: str | None = _UNSET,  # type: ignore[assignment]
    judge: str | None = None,
) -> list[str]:
    """Greedy continuations of ``prompts`` (left-padded batches), in input order.

    Each continuation is cut at ``stop`` (None: not cut), or where ``judge`` cuts it (``first_line``: at the first
    newline; ``lacuna`` and ``loose``: nowhere); give one of the two. Neither: cut at the first newline.
    """
    if judge is not None and stop is not _UNSET:
        raise ValueError("greedy_generate: give stop or judge, not both (the judge decides the cut)")
    stop = judge_stop(judge) if judge is not None else ("\n" if stop is _UNSET else stop)
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
    model,
    tokenizer,
    prompts: Sequence[str],
    answers: Sequence[str],
    fields: Sequence[str],
    *,
    judge: str = DEFAULT_JUDGE,
    **kwargs,
) -> list[bool]:
    """Whether each greedy generation produces its answer under ``judge`` (default ``first_line``, the rule of the
    lm-eval tasks and the testbed's memorization test; ``lacuna``: LACUNA's rule on the whole 20 tokens)."""
    if not len(prompts) == len(answers) == len(fields):
        raise ValueError("prompts, answers and fields must have the same length")
    if "stop" in kwargs:
        raise ValueError("extraction_hits: the judge decides where a generation is cut; stop= is not accepted")
    generations = greedy_generate(model, tokenizer, prompts, judge=judge, **kwargs)
    return [judge_hit(judge, a, g, f) for a, g, f in zip(answers, generations, fields, strict=True)]
