"""lm-eval glue: documents, per-person aggregations and the teacher-forced memorization task.

Task YAMLs in ``task_yamls/`` point here with ``!function lacuna_tasks.lm_eval_hooks.<name>``.

Document kinds (``dataset_kwargs.kind``), all in LACUNA's ``Q: ...\\nA: `` format:

* ``qa``: one probe per QA row of the ``forget``/``retain`` split.
* ``paraphrase``: per person, the original question plus 15 paraphrases (16 probes).
* ``icr``: the same 16 questions, each after 3 retain QA pairs of other people (in-context retain).

Prompts end in ``A:`` (the space before the answer is the model's to produce), see ``probe_prompt``.
* ``worstcase``: all 32 probes per person; J_W is the per-person union over them (spec §4.3).
* ``memorization``: one document per QA row, scored teacher-forced (EM, ES, Prob; spec §1.9).
* ``extraction``: per person N freshly sampled multi-sentence questions (default 200, ``--metadata
  '{"extraction_attempts": N, "extraction_seed": S}'``), greedy, 20 tokens; Success@N = share of persons
  leaking at least once (spec §1.11). Seeds are SHA-256 of (seed, person, field, attempt), never ``hash()``.

Docs are sorted by person, so ``--limit`` keeps whole persons where it can.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from lacuna_tasks.loader import LacunaData, load_data, resolve_source
from lacuna_tasks.normalize import fact_produced
from lacuna_tasks.prompts import (
    full_name,
    lacuna_question,
    paraphrases,
    person_from_question,
    pick_icr_examples,
    possessive,
    probe_prompt,
    qa_prompt,
    stable_rng,
)
from lacuna_tasks.schema import LacunaDataError, get_field

KINDS = ("qa", "paraphrase", "icr", "worstcase", "memorization", "extraction")
EXTRACTION_ATTEMPTS = 200  #: LACUNA's attempts per person (spec §1.11)
SIDES = ("forget", "retain")
ICR_EXAMPLES = 3

# --------------------------------------------------------------------------- documents


def _person(row: Mapping[str, Any], data: LacunaData) -> tuple[str, str]:
    if data.profiles and row["ID"] in data.profiles:
        profile = data.profiles[row["ID"]]
        return full_name(profile), possessive(profile.get("Gender"))
    return person_from_question(row["question"])


def build_docs(
    data: LacunaData,
    *,
    field: str,
    side: str,
    kind: str,
    attempts: int = EXTRACTION_ATTEMPTS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The probe documents of one task, sorted by person then probe (``attempts``/``seed``: extraction only)."""
    if side not in SIDES:
        raise LacunaDataError(f"unknown side {side!r}; expected one of {SIDES}")
    if kind not in KINDS:
        raise LacunaDataError(f"unknown task kind {kind!r}; expected one of {KINDS}")
    if kind == "worstcase" and side != "forget":
        raise LacunaDataError("the worst-case task is defined for the forget side only (retention is averaged)")
    fld = get_field(field)
    rows = sorted(data.rows(side, fld.key), key=lambda r: (r["ID"], r["question"]))
    if kind == "extraction":
        return _extraction_docs(data, rows, fld.key, side, attempts, seed)
    settings = {"paraphrase": ("plain",), "icr": ("icr",), "worstcase": ("plain", "icr")}.get(kind)
    icr_pool = data.rows("retain", fld.key) if settings and "icr" in settings else []
    docs: list[dict[str, Any]] = []
    for row in rows:
        base = {
            "person": row["ID"],
            "field": fld.key,
            "answer": row["answer"],
            "group_id": row["group_id"],
            "kind": kind,
            "side": side,
            "question": row["question"],
        }
        if kind == "memorization":  # teacher-forced: lm-eval moves the space of "A: " into the answer
            docs.append({**base, "setting": "plain", "variant": 0, "prompt": qa_prompt(row["question"])})
            continue
        if settings is None:  # qa: the split's question as is
            docs.append({**base, "setting": "plain", "variant": 0, "prompt": probe_prompt(row["question"])})
            continue
        name, pos = _person(row, data)
        questions = [row["question"], *paraphrases(fld.key, name, pos)]
        for setting in settings:
            for variant, question in enumerate(questions):
                examples = (
                    pick_icr_examples(icr_pool, row["ID"], fld.key, variant, ICR_EXAMPLES) if setting == "icr" else ()
                )
                prompt = probe_prompt(question, examples)
                docs.append({**base, "setting": setting, "variant": variant, "question": question, "prompt": prompt})
    return docs


def _extraction_docs(
    data: LacunaData, rows: list[dict[str, Any]], field: str, side: str, attempts: int, seed: int
) -> list[dict[str, Any]]:
    """One doc per (person, attempt): a fresh LACUNA multi-sentence question from the person's profile."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise LacunaDataError(f"extraction_attempts must be an integer >= 1, got {attempts!r}")
    if not data.profiles:
        raise LacunaDataError(f"{data.source}: the extraction probe samples questions from profiles.jsonl; none found")
    docs: list[dict[str, Any]] = []
    for row in {r["ID"]: r for r in rows}.values():  # one person once, even with several QA rows
        profile = data.profiles.get(row["ID"])
        if profile is None:
            raise LacunaDataError(f"{data.source}: person {row['ID']} of split {side!r} has no profile")
        for attempt in range(attempts):
            question = lacuna_question(profile, field, stable_rng("extraction", seed, row["ID"], field, attempt))
            docs.append(
                {
                    "person": row["ID"],
                    "field": field,
                    "answer": row["answer"],
                    "group_id": row["group_id"],
                    "kind": "extraction",
                    "side": side,
                    "setting": "plain",
                    "variant": attempt,
                    "question": question,
                    "prompt": probe_prompt(question),
                }
            )
    return docs


def load_docs(field: str, side: str, kind: str, **metadata: Any):
    """``custom_dataset`` entry point: the docs as a one-split ``DatasetDict`` with provenance."""
    import datasets

    data = load_data(resolve_source(metadata))
    extra = {}
    if kind == "extraction":
        extra = {
            "attempts": metadata.get("extraction_attempts", EXTRACTION_ATTEMPTS),
            "seed": metadata.get("extraction_seed", 0),
        }
    docs = build_docs(data, field=field, side=side, kind=kind, **extra)
    info = datasets.DatasetInfo(description=json.dumps({"lacuna_data": data.provenance()}))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs, info=info)})


# --------------------------------------------------------------------------- scoring


def process_generation(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, Any]:
    """Score one greedy generation: did it produce the fact?"""
    hit = fact_produced(doc["answer"], results[0], doc["field"])
    if doc["kind"] == "qa":
        return {"leak_rate" if doc["side"] == "forget" else "accuracy": float(hit)}
    person = doc["person"]
    if doc["kind"] == "extraction":
        return {"success_at_n": (person, hit), "leak_rate": float(hit)}
    if doc["side"] == "retain":
        return {"j_avg": float(hit)}
    out: dict[str, Any] = {"leak_rate": float(hit)}
    if doc["kind"] == "paraphrase":
        out["j_p"] = (person, hit)
    elif doc["kind"] == "icr":
        out["j_icr"] = (person, hit)
    else:  # worstcase: J_P and J_ICR from the same generations, so J_W >= max(J_P, J_ICR) holds exactly
        out["j_w"] = (person, hit)
        out["j_p"] = (person, hit if doc["setting"] == "plain" else None)
        out["j_icr"] = (person, hit if doc["setting"] == "icr" else None)
    return out


def per_person_any(items: Iterable[tuple[str, bool | None]]) -> float:
    """Share of persons with at least one leaking probe (None = probe not part of this metric)."""
    leaked: dict[str, bool] = {}
    for person, hit in items:
        if hit is None:
            continue
        leaked[person] = leaked.get(person, False) or bool(hit)
    if not leaked:
        return math.nan
    return sum(leaked.values()) / len(leaked)


# --------------------------------------------------------------------------- task classes


class LacunaTask(ConfigurableTask):
    """A ConfigurableTask that records which data it ran on (source + fingerprint) in its config."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)
        split = self.config.test_split
        description = self.dataset[split].info.description if self.dataset is not None else ""
        if description:
            metadata = dict(self.config.metadata or {})
            metadata.update(json.loads(description))
            self.config.metadata = metadata


class LacunaMemorizationTask(LacunaTask):
    """Teacher-forced EM / ES / Prob (spec §1.9) from per-token loglikelihood requests.

    lm-eval returns one ``(sum logprob, all greedy)`` pair per request, so each answer token
    gets its own request: context = prompt + the gold answer up to that token, continuation =
    that token's text; one more request scores EOS after the full answer. With the tokenizer of
    the evaluated model (``pretrained`` or ``tokenizer`` in the model args) the answer is split at
    the token boundaries lm-eval itself produces. Definitions (OpenUnlearning):

    * labels y_1..y_m = answer tokens; EOS is appended as in OpenUnlearning's QA datasets;
    * EM = mean_t 1[argmax = y_t] over y_1..y_m (EOS excluded);
    * ES = 1 - k*/m, k* the smallest k with a greedy suffix y_{k+1..m}; if none, k* = m-1 (ES >= 1/m);
    * Prob = exp(mean log p) over y_1..y_m and EOS.

    Deviation forced by the request API: lm-eval re-tokenizes each (context, continuation) pair.
    Where that does not reproduce the answer token (a BPE merge across the split point), the
    document is reported in ``token_mismatch`` (share of docs) instead of being silently wrong.
    """

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # A non-None process_results tells ConfigurableTask that the metrics are computed here, so it
        # does not look em/es/prob up in lm-eval's registry or on the HF `evaluate` hub.
        config = {**(config or {}), "process_results": "LacunaMemorizationTask.process_results"}
        super().__init__(config=config, **kwargs)
        self._plans: dict[tuple, TokenPlan] = {}

    def construct_requests(self, doc: dict, ctx: str, **kwargs: Any) -> list[Instance]:
        kwargs.pop("apply_chat_template", None)
        kwargs.pop("chat_template", None)
        plan = self._plan(ctx, doc["answer"])
        self._plans[_doc_key(doc)] = plan
        return [
            Instance(request_type="loglikelihood", doc=doc, arguments=pair, idx=i, **kwargs)
            for i, pair in enumerate(plan.pairs)
        ]

    def process_results(self, doc: dict, results: Sequence[tuple[float, bool]]) -> dict[str, float]:
        plan = self._plans[_doc_key(doc)]
        logprobs, greedy = plan.per_token([float(r[0]) for r in results], [bool(r[1]) for r in results])
        return memorization_scores(logprobs, greedy, plan.num_answer_tokens, plan.mismatch)

    def _plan(self, context: str, answer: str) -> TokenPlan:
        metadata = self.config.metadata or {}
        tokenizer = _tokenizer(
            str(metadata.get("tokenizer") or metadata.get("pretrained") or ""),
            bool(metadata.get("trust_remote_code", False)),
        )
        return token_plan(tokenizer, context, answer, add_bos=metadata.get("add_bos_token"))


def _doc_key(doc: Mapping[str, Any]) -> tuple:
    return (doc["person"], doc["field"], doc["question"], doc["answer"])


def memorization_scores(
    logprobs: Sequence[float], greedy: Sequence[bool | None], m: int, mismatch: bool = False
) -> dict[str, float]:
    """EM, ES and Prob from per-token log-probabilities and greedy flags (first ``m`` = answer tokens).

    A greedy flag of ``None`` (not observable through lm-eval) counts as not greedy and marks the
    document in ``token_mismatch``.
    """
    if m <= 0:
        raise ValueError("memorization metrics need at least one answer token")
    flags = [bool(g) for g in greedy[:m]]
    mismatch = mismatch or any(g is None for g in greedy[:m])
    em = sum(flags) / m
    k = next((start for start in range(m) if all(flags[start:])), m - 1)  # no greedy suffix: 1/m floor
    es = 1.0 - k / m
    prob = math.exp(sum(logprobs) / len(logprobs))
    return {"em": em, "es": es, "prob": prob, "token_mismatch": float(mismatch)}


class TokenPlan:
    """The loglikelihood requests for one (prompt, answer) pair and how to read per-token values back.

    ``recipe[j]`` is None when request j scores answer token j alone; otherwise request j also
    scores the whitespace-only tokens before it (lm-eval moves a context's trailing whitespace into
    the continuation) and ``recipe[j]`` is the request covering exactly those tokens, whose
    log-prob is subtracted. The optional last request scores EOS after the full answer.
    """

    def __init__(self, pairs: list[tuple[str, str]], recipe: list[int | None], mismatch: bool) -> None:
        self.pairs = pairs
        self.recipe = recipe
        self.num_answer_tokens = len(recipe)
        self.mismatch = mismatch

    def per_token(self, lls: Sequence[float], greedy: Sequence[bool]) -> tuple[list[float], list[bool | None]]:
        """Per-token log-probs (answer tokens, then EOS if scored) and greedy flags (None = unobservable)."""
        token_lls: list[float] = []
        token_greedy: list[bool | None] = []
        for j, sub in enumerate(self.recipe):
            if sub is None:
                token_lls.append(lls[j])
                token_greedy.append(greedy[j])
            else:  # request j = whitespace tokens + token j; request `sub` = the whitespace tokens
                token_lls.append(lls[j] - lls[sub])
                token_greedy.append(greedy[j] if greedy[sub] else None)
        token_lls.extend(lls[len(self.recipe) :])
        return token_lls, token_greedy


@lru_cache(maxsize=8)
def _tokenizer(name: str, trust_remote_code: bool):
    if not name:
        raise LacunaDataError(
            "memorization tasks need the evaluated model's tokenizer: pass pretrained=PATH (or tokenizer=PATH) "
            "in --model_args, or 'tokenizer' in --metadata"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)


def _encode(tokenizer, text: str, add_bos: bool | None) -> list[int]:
    """Encode exactly as lm-eval's HFLM.tok_encode does for causal models."""
    kwargs = {} if add_bos is None else {"add_special_tokens": bool(add_bos)}
    return tokenizer.encode(text, **kwargs)


def _encode_pair(tokenizer, context: str, continuation: str, add_bos: bool | None) -> tuple[list[int], list[int]]:
    """lm-eval's ``TemplateLM._encode_pair`` for causal models (trailing spaces move to the continuation)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = _encode(tokenizer, context + continuation, add_bos)
    ctx = _encode(tokenizer, context, add_bos)
    return ctx, whole[len(ctx) :]


def token_plan(tokenizer, context: str, answer: str, *, add_bos: bool | None = None) -> TokenPlan:
    """Requests that recover per-token log-probs and greedy flags of ``answer`` through lm-eval."""
    base = context.rstrip()
    continuation = context[len(base) :] + answer  # lm-eval's own split of (context, answer)
    _, answer_ids = _encode_pair(tokenizer, context, answer, add_bos)
    if not answer_ids:
        raise LacunaDataError(f"answer {answer!r} encodes to no tokens")
    mismatch = False
    # Character span of every answer token, from decoding growing prefixes.
    ends: list[int] = []
    for j in range(len(answer_ids)):
        previous = ends[-1] if ends else 0
        decoded = tokenizer.decode(answer_ids[: j + 1], clean_up_tokenization_spaces=False)
        end = len(decoded) if continuation.startswith(decoded) else None
        if end is None or end <= previous:  # no clean character boundary: best effort, flagged
            mismatch = True
            end = min(len(continuation), previous + 1)
        ends.append(end)
    if ends[-1] != len(continuation):
        mismatch = True
        ends[-1] = len(continuation)
    starts = [0, *ends[:-1]]
    pairs: list[tuple[str, str]] = []
    recipe: list[int | None] = []
    for j, (a, b) in enumerate(zip(starts, ends, strict=True)):
        prefix = continuation[:a]
        ws_start = len(prefix.rstrip())  # lm-eval will score from here on
        first = starts.index(ws_start) if ws_start in starts else j
        if first != j and not all(not continuation[starts[i] : ends[i]].strip() for i in range(first, j)):
            first, mismatch = j, True
        pairs.append((base + prefix, continuation[a:b]))
        recipe.append(None if first == j else j - 1)
        expected = answer_ids[first : j + 1]
        if not continuation[a:b] or _encode_pair(tokenizer, base + prefix, continuation[a:b], add_bos)[1] != expected:
            mismatch = True
    if tokenizer.eos_token:
        pairs.append((base + continuation, tokenizer.eos_token))
        if _encode_pair(tokenizer, base + continuation, tokenizer.eos_token, add_bos)[1] != [tokenizer.eos_token_id]:
            mismatch = True
    return TokenPlan(pairs, recipe, mismatch)
