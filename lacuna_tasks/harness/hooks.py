"""lm-eval glue: documents, per-person aggregations and the teacher-forced memorization task.

Task YAMLs in ``task_yamls/`` point here with ``!function lacuna_tasks.harness.hooks.<name>``.

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

Docs are sorted by person, so ``--limit`` keeps whole persons where it can. The memorization task's per-token
request planning (``token_plan``, ``LmEvalEncoding``) lives in :mod:`lacuna_tasks.harness.memorization`.

The per-person aggregates (J_P, J_ICR, J_W, Success@N: ``per_person_any``) report their lm-eval stderr over
persons, not documents (``per_person_stderr``, wired into lm-eval by ``install_person_stderr``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from lacuna_tasks.harness.memorization import (
    GREEDY_TOKEN_GEN_KWARGS,
    LmEvalEncoding,
    TokenPlan,
    TokenSlot,
    load_encoding,
    memorization_scores,
    token_plan,
)
from lacuna_tasks.loader import NO_PROFILES_HINT, LacunaData, load_data, resolve_source
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
)
from lacuna_tasks.schema import LacunaDataError, get_field
from lacuna_tasks.seeding import stable_rng

#: Names this module kept when the memorization request planning moved to :mod:`lacuna_tasks.harness.memorization`.
__all__ = [
    "EXTRACTION_ATTEMPTS",
    "GREEDY_TOKEN_GEN_KWARGS",
    "ICR_EXAMPLES",
    "KINDS",
    "PARAPHRASED_SPLITS",
    "SIDES",
    "LacunaMemorizationTask",
    "LacunaTask",
    "LmEvalEncoding",
    "TokenPlan",
    "TokenSlot",
    "build_docs",
    "data_errors_in_one_line",
    "install_person_stderr",
    "load_docs",
    "memorization_scores",
    "per_person_any",
    "per_person_stderr",
    "per_person_values",
    "process_generation",
    "token_plan",
]

KINDS = ("qa", "paraphrase", "icr", "worstcase", "memorization", "extraction")
EXTRACTION_ATTEMPTS = 200  #: LACUNA's attempts per person (docs/definitions.md#extraction-probe-and-leak-rate)
SIDES = ("forget", "retain")
#: LACUNA's second question per person (a different multi-sentence prompt for the same fact,
#: docs/definitions.md#memorization-test-and-splits), on which the memorization metrics are also reported
#: (docs/definitions.md#memorization-metrics); a task reads them with ``side: forget_paraphrased``.
PARAPHRASED_SPLITS = ("forget_paraphrased", "retain_paraphrased")
ICR_EXAMPLES = 3


def _icr_pool(data: LacunaData, field_key: str) -> list[dict[str, Any]]:
    """The retain QA pairs an ICR prompt draws its examples from: the retain split's; when it holds too few people
    for a retain person's prompt (its own row is left out), the held-out retain-eval people's too. They are
    retain-side people in no unlearning input, so showing them in a prompt changes no loss (a small testbed: 3
    retain people per field)."""
    pool = data.rows("retain", field_key)
    if len({str(r["ID"]) for r in pool}) <= ICR_EXAMPLES and data.has_split("retain_eval"):
        column = get_field(field_key).column
        pool = pool + [r for r in data.splits["retain_eval"] if r["field"] == column]
    return pool


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
    icr_pool = _icr_pool(data, fld.key) if settings and "icr" in settings else []
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
        raise LacunaDataError(
            f"{data.source}: the extraction probe samples questions from profiles.jsonl; none found" + NO_PROFILES_HINT
        )
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
    ``lacuna_tasks.harness.evaluate``) the :class:`LacunaDataError` propagates to the caller as usual.
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
        return load_encoding(
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
