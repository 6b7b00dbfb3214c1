"""lm-eval glue: documents, per-person aggregations and the teacher-forced memorization task.

Task YAMLs in ``task_yamls/`` point here with ``!function lacuna_tasks.lm_eval_hooks.<name>``.

Document kinds (``dataset_kwargs.kind``), all in LACUNA's ``Q: ...\\nA: `` format:

* ``qa``: one probe per QA row of the ``forget``/``retain`` split.
* ``paraphrase``: per person, the original question plus 15 paraphrases (16 probes).
* ``icr``: the same 16 questions, each after 3 retain QA pairs of other people (in-context retain).

Prompts end in ``A:`` (the space before the answer is the model's to produce), see ``probe_prompt``.
* ``worstcase``: all 32 probes per person; J_W is the per-person union over them
  (docs/definitions.md#worst-case-metrics).
* ``memorization``: one document per QA row, scored teacher-forced (EM, ES, Prob;
  docs/definitions.md#memorization-metrics).
* ``extraction``: per person N freshly sampled multi-sentence questions (default 200, ``--metadata
  '{"extraction_attempts": N, "extraction_seed": S}'``), greedy, 20 tokens; Success@N = share of persons
  leaking at least once (docs/definitions.md#extraction-probe-and-leak-rate). Seeds are SHA-256 of (seed, person, field,
  attempt), never ``hash()``.

Docs are sorted by person, so ``--limit`` keeps whole persons where it can.

The per-person aggregates (J_P, J_ICR, J_W, Success@N: ``per_person_any``) report their lm-eval stderr over
persons, not documents (``per_person_stderr``, wired into lm-eval by ``install_person_stderr``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
EXTRACTION_ATTEMPTS = 200  #: LACUNA's attempts per person (docs/definitions.md#extraction-probe-and-leak-rate)
SIDES = ("forget", "retain")
#: LACUNA's second question per person (a different multi-sentence prompt for the same fact,
#: docs/definitions.md#memorization-test-and-splits), on which the memorization metrics are also reported
#: (docs/definitions.md#memorization-metrics); a task reads them with ``side: forget_paraphrased``.
PARAPHRASED_SPLITS = ("forget_paraphrased", "retain_paraphrased")
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
    if side not in SIDES + PARAPHRASED_SPLITS:
        raise LacunaDataError(f"unknown side {side!r}; expected one of {SIDES + PARAPHRASED_SPLITS}")
    if kind not in KINDS:
        raise LacunaDataError(f"unknown task kind {kind!r}; expected one of {KINDS}")
    if side in PARAPHRASED_SPLITS and kind not in ("qa", "memorization"):
        raise LacunaDataError(f"split {side!r} holds one question per person: kind qa or memorization, not {kind!r}")
    if kind == "worstcase" and side != "forget":
        raise LacunaDataError("the worst-case task is defined for the forget side only (retention is averaged)")
    fld = get_field(field)
    split, side = side, side.removesuffix("_paraphrased")  # the split read; the role it plays (forget/retain)
    rows = sorted(data.rows(split, fld.key), key=lambda r: (r["ID"], r["question"]))
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
            "split": split,
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
    """``custom_dataset`` entry point: the docs as a one-split ``DatasetDict`` with provenance.

    Under the ``lm_eval`` command, bad data ends the run with one line naming the file, split, row and column
    (exit 2) instead of lm-eval's traceback through its task loader; called from Python (``lacuna run``,
    ``lacuna_tasks.evaluate``) the :class:`LacunaDataError` propagates to the caller as usual.
    """
    import datasets

    with data_errors_in_one_line():
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


@contextmanager
def data_errors_in_one_line() -> Iterator[None]:
    """Around a ``custom_dataset`` function: under the ``lm_eval`` command a :class:`LacunaDataError` becomes one
    line on stderr and exit status 2 (lm-eval would print a traceback through its task loader); elsewhere it
    propagates unchanged."""
    try:
        yield
    except LacunaDataError as exc:
        if not _under_lm_eval_cli():
            raise
        import sys

        print(f"lm_eval: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _under_lm_eval_cli() -> bool:
    """True when this process is the ``lm_eval`` / ``lm-eval`` command (or ``python -m lm_eval``)."""
    import sys
    from pathlib import Path

    if not sys.argv or not sys.argv[0]:
        return False
    script = Path(sys.argv[0])
    return script.name in ("lm_eval", "lm-eval") or (script.name == "__main__.py" and script.parent.name == "lm_eval")


# --------------------------------------------------------------------------- scoring


def process_generation(doc: Mapping[str, Any], results: Sequence[str]) -> dict[str, Any]:
    """Score one greedy generation: did it produce the fact?

    Per-person metrics return ``(person, hit)`` pairs; the union over a person's probes happens in
    ``per_person_any``, which lm-eval calls on rank 0 after gathering every rank's per-document values, so
    any split of the documents across processes gives the same aggregates (``docs/distributed.md``). Every
    document of a task returns the same keys: lm-eval's rank 0 keeps only the metric keys it saw itself.
    """
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


def per_person_any(items: Iterable[tuple[str, bool | None]]) -> float | None:
    """Share of persons with at least one leaking probe (None = probe not part of this metric).

    None (JSON ``null``) when no document observed the metric, e.g. ``j_icr`` of the worst-case task under
    ``--limit 4``, whose first documents are all plain probes: "not measured", as ``lacuna gate`` reads a missing
    metric, instead of a NaN that is not JSON and turns every mean it enters into NaN (docs/tasks.md).
    """
    values = per_person_values(items)
    if not values:
        return None
    return sum(values.values()) / len(values)


def per_person_values(items: Iterable[tuple[str, bool | None]]) -> dict[str, float]:
    """Per person: 1.0 if any of the person's probes leaked, else 0.0 (None items are not part of the metric)."""
    leaked: dict[str, bool] = {}
    for person, hit in items:
        if hit is None:
            continue
        leaked[person] = leaked.get(person, False) or bool(hit)
    return {person: float(hit) for person, hit in leaked.items()}


def per_person_stderr(items: Iterable[tuple[str, bool | None]]) -> float | str:
    """Standard error of :func:`per_person_any` over persons: sample sd (n - 1) of the per-person 0/1 values
    divided by sqrt(n persons), lm-eval's ``mean_stderr`` applied to persons instead of documents.

    ``"N/A"`` (lm-eval's marker for "no stderr") with fewer than two persons. lm-eval reports it as
    ``<metric>_stderr,none``; :func:`install_person_stderr` is what makes lm-eval call it.
    """
    values = list(per_person_values(items).values())
    n = len(values)
    if n < 2:
        return "N/A"
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


#: lm-eval's stderr for an aggregation callable: read by the wrapper :func:`install_person_stderr` installs.
per_person_any.lacuna_stderr = per_person_stderr  # type: ignore[attr-defined]


def install_person_stderr() -> bool:
    """Make lm-eval report the stderr of the per-person aggregates over persons (``docs/tasks.md``).

    lm-eval 0.4.x picks a metric's stderr function in ``stderr_for_metric(aggregation, bootstrap_iters)``, which
    knows only its own aggregations by identity: for a custom ``!function`` aggregation such as
    :func:`per_person_any` it returns None and the results say ``"N/A"``. This wraps the function that
    ``lm_eval.evaluator_utils`` calls so that an aggregation carrying a ``lacuna_stderr`` attribute gets that
    function (and ``--bootstrap_iters 0`` still turns every stderr off); any other aggregation is answered by
    lm-eval's own function. Idempotent; called when this module is imported, which lm-eval does when it loads
    any LACUNA task. Returns False (stderr stays "N/A") if the installed lm-eval has no such function.
    """
    import functools

    try:
        from lm_eval import evaluator_utils
    except ImportError:  # pragma: no cover - lm-eval without the module: nothing to wrap
        return False
    original = getattr(evaluator_utils, "stderr_for_metric", None)
    if original is None:
        return False
    if getattr(original, "_lacuna_person_stderr", False):
        return True

    @functools.wraps(original)
    def stderr_for_metric(metric: Any, bootstrap_iters: int) -> Any:
        own = getattr(metric, "lacuna_stderr", None)
        if own is not None:
            return own if bootstrap_iters > 0 else None
        return original(metric, bootstrap_iters)

    stderr_for_metric._lacuna_person_stderr = True  # type: ignore[attr-defined]
    evaluator_utils.stderr_for_metric = stderr_for_metric
    return True


install_person_stderr()


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
    """Teacher-forced EM / ES / Prob (docs/definitions.md#memorization-metrics), exact for any tokenizer (design:
    ``docs/tasks.md``).

    Definitions (OpenUnlearning): the answer tokens y_1..y_m are the tokens lm-eval itself scores for
    ``(prompt, answer)``: ``prompt + answer`` is encoded whole and split after the tokens of the prompt
    without its trailing space. EOS is appended as in OpenUnlearning's QA datasets.

    * EM = mean_t 1[argmax = y_t] over y_1..y_m (EOS excluded);
    * ES = 1 - k*/m, k* the smallest k with a greedy suffix y_{k+1..m}; if none, k* = m-1 (ES >= 1/m);
    * Prob = exp(mean log p) over y_1..y_m and EOS.

    lm-eval returns one ``(sum logprob, all greedy)`` pair per loglikelihood request, so each answer
    token gets its own request, cut out of the text at that token's character boundaries in the
    tokenization of ``prompt + answer`` as a whole (see ``token_plan``). Every request is checked
    against lm-eval's own tokenization (``LmEvalEncoding``) before it is issued; a value that no
    request can observe is reported in ``token_mismatch`` (share of documents) instead of being
    silently wrong, and no request can reach lm-eval with an empty continuation.
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
        plan = token_plan(self._encoding(), ctx, doc["answer"])
        self._plans[_doc_key(doc)] = plan
        return [
            Instance(request_type=request_type, doc=doc, arguments=arguments, idx=i, **kwargs)
            for i, (request_type, arguments) in enumerate(plan.requests)
        ]

    def process_results(self, doc: dict, results: Sequence[Any]) -> dict[str, float]:
        plan = self._plans[_doc_key(doc)]
        logprobs, greedy = plan.per_token(results)
        return memorization_scores(logprobs, greedy, plan.num_answer_tokens, plan.mismatch)

    def _encoding(self) -> LmEvalEncoding:
        """The evaluated model's tokenizer, loaded with the model args lm-eval's ``HFLM`` uses for it."""
        md = self.config.metadata or {}
        name = md.get("tokenizer") or md.get("pretrained")
        return _load_encoding(
            name if isinstance(name, str) else "",
            revision=str(md.get("revision") or "main"),
            subfolder=str(md.get("subfolder") or ""),
            trust_remote_code=_flag(md.get("trust_remote_code"), False),
            use_fast=_flag(md.get("use_fast_tokenizer"), True),
            add_bos_token=_flag(md.get("add_bos_token"), None),
            prefix_token_id=None if md.get("prefix_token_id") is None else int(md["prefix_token_id"]),
        )


def _doc_key(doc: Mapping[str, Any]) -> tuple:
    return (doc["person"], doc["field"], doc["question"], doc["answer"])


def _flag(value: Any, default: bool | None) -> bool | None:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


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


# --------------------------------------------------------------------------- request planning

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

    ``tests/test_tokenizer_families.py`` checks this mirror against a real ``HFLM``.
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
def _load_encoding(
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
