"""Teacher-forced memorization through lm-eval: its tokenization mirrored, one request per answer token.

lm-eval returns one ``(sum logprob, all greedy)`` pair per loglikelihood request, so EM / ES / Prob
(docs/definitions.md#memorization-metrics; design in ``docs/tasks.md``) need each answer token observed on its own.
:class:`LmEvalEncoding` mirrors lm-eval's ``HFLM`` tokenization so that every request :func:`token_plan` builds is
checked before it is issued; :class:`TokenPlan` reads the per-token values back and :func:`memorization_scores`
turns them into the metrics. The lm-eval task class that uses them is
:class:`lacuna_tasks.harness.hooks.LacunaMemorizationTask`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from lacuna_tasks.schema import LacunaDataError

__all__ = [
    "GREEDY_TOKEN_GEN_KWARGS",
    "LmEvalEncoding",
    "TokenPlan",
    "TokenSlot",
    "load_encoding",
    "memorization_scores",
    "token_plan",
]


def memorization_scores(
    logprobs: Sequence[float | None], greedy: Sequence[bool | None], m: int, mismatch: bool = False
) -> dict[str, float]:
    """EM, ES and Prob from per-token log-probabilities and greedy flags (first ``m`` = answer tokens).

    ``None`` marks a value lm-eval cannot observe: such a greedy flag counts as not greedy, such a
    log-probability is left out of Prob, and either marks the document in ``token_mismatch``.
    """
    if m <= 0:
        raise ValueError("memorization metrics need at least one answer token")
    flags = [bool(g) for g in greedy[:m]]
    mismatch = mismatch or any(g is None for g in greedy[:m]) or any(lp is None for lp in logprobs)
    em = sum(flags) / m
    k = next((start for start in range(m) if all(flags[start:])), m - 1)  # no greedy suffix: 1/m floor
    es = 1.0 - k / m
    known = [lp for lp in logprobs if lp is not None]
    prob = math.exp(sum(known) / len(known)) if known else 0.0
    return {"em": em, "es": es, "prob": prob, "token_mismatch": float(mismatch)}


#: generate_until arguments that return exactly the model's greedy next token (as text).
GREEDY_TOKEN_GEN_KWARGS: dict[str, Any] = {"until": [], "max_gen_toks": 1, "do_sample": False}


class LmEvalEncoding:
    """lm-eval's ``HFLM`` tokenization for causal models, mirrored so that every request can be checked.

    * ``encode`` is ``HFLM.tok_encode`` (BOS as the tokenizer adds it unless ``add_bos_token`` says
      otherwise; never twice when the text already starts with it);
    * ``encode_pair`` is ``TemplateLM._encode_pair``: the context's trailing whitespace moves to the
      continuation, context + continuation are encoded whole and split at the context's token count;
    * ``encode_prompt`` is ``HFLM.tok_batch_encode`` for one ``generate_until`` context (no whitespace moved);
    * ``generated_text`` is what ``HFLM.generate_until`` returns for some generated token ids.

    ``tests/tasks/harness/test_tokenizer_families.py`` checks this mirror against a real ``HFLM``.
    """

    def __init__(self, tokenizer: Any, *, add_bos_token: bool | None = None, prefix_token_id: int | None = None):
        self.tokenizer = tokenizer
        self.add_bos_token = add_bos_token
        if prefix_token_id is None:  # HFLM.prefix_token_id
            prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.prefix_token_id = prefix_token_id
        self._prefix_text = tokenizer.decode(prefix_token_id) if prefix_token_id is not None else None
        eos_id = tokenizer.eos_token_id
        self._stop = tokenizer.decode(eos_id, skip_special_tokens=False) if eos_id is not None else None
        self._greedy_strings: dict[str, int] | None = None

    def _special_tokens(self, text: str, bos_text: str | None) -> dict[str, bool]:
        if bos_text is not None and text.startswith(bos_text):
            return {"add_special_tokens": False}
        return {} if self.add_bos_token is None else {"add_special_tokens": bool(self.add_bos_token)}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, **self._special_tokens(text, self._prefix_text)))

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        ctx = self.encode(context)
        return ctx, whole[len(ctx) :]

    def encode_prompt(self, context: str) -> list[int]:
        special = self._special_tokens(context, getattr(self.tokenizer, "bos_token", None))
        return list(self.tokenizer(context, **special)["input_ids"])

    def generated_text(self, token_ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text.split(self._stop)[0] if self._stop else text  # EOS is always a stop sequence

    def greedy_text(self, token_id: int) -> str | None:
        """The text ``generate_until`` returns when ``token_id`` is the greedy token, if no other token
        gives the same text (None otherwise: greedy generation cannot tell them apart)."""
        if self._greedy_strings is None:
            texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))], skip_special_tokens=True)
            counts: dict[str, int] = {}
            for text in texts:
                text = text.split(self._stop)[0] if self._stop else text
                counts[text] = counts.get(text, 0) + 1
            self._greedy_strings = counts
        text = self.generated_text([token_id])
        return text if text and self._greedy_strings.get(text) == 1 else None

    def offsets(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]] | None:
        """Character offsets of ``ids`` = ``encode(text)``, where the tokenizer provides them."""
        try:
            enc = self.tokenizer(text, return_offsets_mapping=True, **self._special_tokens(text, self._prefix_text))
        except (NotImplementedError, TypeError, ValueError):
            return None
        if list(enc["input_ids"]) != list(ids):
            return None
        return [tuple(o) for o in enc["offset_mapping"]]


@lru_cache(maxsize=8)
def load_encoding(
    name: str,
    *,
    revision: str,
    subfolder: str,
    trust_remote_code: bool,
    use_fast: bool,
    add_bos_token: bool | None,
    prefix_token_id: int | None,
) -> LmEvalEncoding:
    if not name:
        raise LacunaDataError(
            "memorization tasks need the evaluated model's tokenizer: pass pretrained=PATH (or tokenizer=PATH) "
            "in --model_args, or 'tokenizer' in --metadata"
        )
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"revision": revision, "trust_remote_code": trust_remote_code, "use_fast": use_fast}
    if add_bos_token is not None:
        kwargs["add_bos_token"] = add_bos_token
    if subfolder:
        kwargs["subfolder"] = subfolder
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    return LmEvalEncoding(tokenizer, add_bos_token=add_bos_token, prefix_token_id=prefix_token_id)


class TokenSlot:
    """How one answer token is read back from the plan's results.

    ``request``: the loglikelihood request whose continuation ends with this token (None: unobservable).
    ``covers``: how many tokens that request scores, this one and the ``covers - 1`` before it (lm-eval
    moves a context's trailing whitespace into the continuation, so a token after a whitespace token
    comes with it). Its log-prob is then a difference, and its greedy flag is the request's own when
    the tokens before it are all greedy; otherwise ``generation`` (a one-token greedy ``generate_until``
    request on the exact context) is compared with ``expected``, the text of the token.
    """

    __slots__ = ("request", "covers", "generation", "expected")

    def __init__(
        self, request: int | None, covers: int = 1, generation: int | None = None, expected: str | None = None
    ) -> None:
        self.request = request
        self.covers = covers
        self.generation = generation
        self.expected = expected

    def __repr__(self) -> str:
        return f"TokenSlot({self.request}, covers={self.covers}, generation={self.generation})"


class TokenPlan:
    """The requests for one (prompt, answer) pair and how to read per-token values back from their results.

    ``requests[i]`` is ``(request_type, arguments)``; ``slots[t]`` reads answer token t; ``eos_request``
    scores EOS after the full answer; ``answer_ids`` are the answer tokens; ``mismatch`` is set when some
    value cannot be observed through lm-eval (the document then counts in ``token_mismatch``).
    """

    def __init__(
        self,
        requests: list[tuple[str, tuple]],
        slots: list[TokenSlot],
        eos_request: int | None,
        mismatch: bool,
        answer_ids: Sequence[int] = (),
    ) -> None:
        self.requests = requests
        self.slots = slots
        self.eos_request = eos_request
        self.mismatch = mismatch
        self.answer_ids = list(answer_ids)
        self.num_answer_tokens = len(slots)

    def per_token(self, results: Sequence[Any]) -> tuple[list[float | None], list[bool | None]]:
        """Per-token log-probs (answer tokens, then EOS if scored) and greedy flags; None = unobservable."""
        lls: list[float | None] = []
        flags: list[bool | None] = []
        for t, slot in enumerate(self.slots):
            if slot.request is None:
                lls.append(None)
                flags.append(None)
                continue
            ll, greedy = float(results[slot.request][0]), bool(results[slot.request][1])
            before = range(t - slot.covers + 1, t)
            known = all(lls[i] is not None for i in before)
            lls.append(ll - sum(lls[i] for i in before) if known else None)  # type: ignore[misc]
            if all(flags[i] is True for i in before):  # all-greedy of the request = this token's flag
                flags.append(greedy)
            elif slot.generation is not None:
                flags.append(results[slot.generation] == slot.expected)
            else:
                flags.append(None)
        if self.eos_request is not None:
            lls.append(float(results[self.eos_request][0]))
        return lls, flags


def _token_starts(encoding: LmEvalEncoding, text: str, ids: list[int], first: int) -> list[int | None]:
    """``starts[p - first]``: a character position c with ``encode(text[:c]) == ids[:p]``, for p = first..len(ids).

    The tokenizer's offsets propose c (the end of token p-1); a proposal that does not re-encode to
    exactly the first p tokens is replaced by a scan. None: no prefix of the text encodes to ids[:p].
    """
    offsets = encoding.offsets(text, ids)
    starts: list[int | None] = []
    low = 0
    for p in range(first, len(ids)):
        guess = offsets[p - 1][1] if offsets and p > 0 else None
        if guess is not None and guess > low and encoding.encode(text[:guess]) == ids[:p]:
            found: int | None = guess
        else:
            found = next((c for c in range(low + 1, len(text)) if encoding.encode(text[:c]) == ids[:p]), None)
        starts.append(found)
        if found is not None:
            low = found
    starts.append(len(text))
    return starts


def token_plan(encoding: LmEvalEncoding | Any, prompt: str, answer: str) -> TokenPlan:
    """Requests that observe the log-prob and greedy flag of every answer token, and EOS, through lm-eval.

    ``encoding`` is an ``LmEvalEncoding`` (a bare HF tokenizer is wrapped with lm-eval's defaults).
    Answer token p of ``prompt + answer`` (encoded whole) gets, in order of preference:

    1. ``(text[:start], text[start:end])``, the text cut at the token's boundaries; checked to reach lm-eval
       as exactly context = tokens before p, continuation = [token p];
    2. when that context ends in whitespace (lm-eval would move it to the continuation): the same with the
       trailing spaces written as U+2581, which SentencePiece tokenizers read as spaces (checked likewise);
    3. otherwise the request as lm-eval will split it (the whitespace tokens before p scored with it), plus a
       one-token greedy ``generate_until`` request on the unsplit context for the greedy flag.

    EOS is scored by ``(prompt + answer, eos_token)``. A token none of these observe is flagged.
    """
    if not isinstance(encoding, LmEvalEncoding):
        encoding = LmEvalEncoding(encoding)
    if not answer.strip():
        raise LacunaDataError(f"empty answer {answer!r}: nothing to score")
    text = prompt + answer
    base = prompt.rstrip()
    if not base:
        raise LacunaDataError("memorization prompts must not be empty")
    ids = encoding.encode(text)
    ctx_ids = encoding.encode(base)
    mismatch = ids[: len(ctx_ids)] != ctx_ids  # lm-eval's own split of (prompt, answer) is not a clean cut
    first = len(ctx_ids)
    if first >= len(ids):
        raise LacunaDataError(f"answer {answer!r} encodes to no tokens after {prompt!r}")
    starts = _token_starts(encoding, text, ids, first)
    requests: list[tuple[str, tuple]] = []
    slots: list[TokenSlot] = []

    def add(request_type: str, arguments: tuple) -> int:
        requests.append((request_type, arguments))
        return len(requests) - 1

    for t, p in enumerate(range(first, len(ids))):
        start, end = starts[t], starts[t + 1]
        if start is None or end is None or end <= start:
            slots.append(TokenSlot(None))
            mismatch = True
            continue
        context, piece = text[:start], text[start:end]
        candidates = [context]
        stripped = context.rstrip(" ")
        if stripped != context:
            candidates.append(stripped + "\u2581" * (len(context) - len(stripped)))
        for candidate in candidates:
            ctx, cont = encoding.encode_pair(candidate, piece)
            if ctx == ids[:p] and cont == [ids[p]]:
                slots.append(TokenSlot(add("loglikelihood", (candidate, piece))))
                break
        else:
            ctx, cont = encoding.encode_pair(context, piece)
            q = len(ctx)
            if ctx + cont != ids[: p + 1] or not first <= q < p or any(s.request is None for s in slots[q - first :]):
                slots.append(TokenSlot(None))
                mismatch = True
                continue
            expected = encoding.greedy_text(ids[p])
            generation = None
            if expected is not None and encoding.encode_prompt(context) == ids[:p]:
                generation = add("generate_until", (context, dict(GREEDY_TOKEN_GEN_KWARGS)))
            # without it, the flag is known only when the whitespace before the token is greedy (per_token)
            slots.append(TokenSlot(add("loglikelihood", (context, piece)), p - q + 1, generation, expected))

    eos_request = None
    eos, eos_id = encoding.tokenizer.eos_token, encoding.tokenizer.eos_token_id
    if eos and eos_id is not None:
        if encoding.encode_pair(text, eos) == (ids, [eos_id]):
            eos_request = add("loglikelihood", (text, eos))
        else:
            mismatch = True
    if not requests:  # lm-eval needs one request per document; this one is scored by nothing
        requests.append(("loglikelihood", (prompt, answer)))
    return TokenPlan(requests, slots, eos_request, mismatch, ids[first:])
