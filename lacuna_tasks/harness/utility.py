"""lm-eval tasks for utility that can fail: held-out retain accuracy and cross-field retention.

A method's retain loss trains on the ``retain`` rows, so accuracy on those rows says little. These tasks
probe facts no unlearning input contains (design and reading: ``docs/tasks.md``):

* ``lacuna_<f>_retain_eval_qa``: field ``f`` of the held-out ``retain_eval`` people (people memorized like
  the retain people, never in a forget or retain row; ``build_splits(retain_eval_people=N)``);
* ``lacuna_<f>_crossfield_qa``: the other three fields of the forget people of ``f`` (a ``field=f`` run
  must keep a person's birth city while erasing the email);
* ``lacuna_<f>_retain_eval_crossfield_qa``: the other three fields of the retain-eval people of ``f``.

Each document is one fact: the split's own question in LACUNA's probe format, greedy, 20 tokens,
scored by :func:`lacuna_tasks.harness.hooks.process_generation` (``accuracy``: the fact produced). The
cross-field tasks take every question from the split that holds the person's other fields, so only
memorized facts are asked; a person without a row for some field simply has fewer documents.

Data built before the retain-eval splits existed (old testbeds, the bundled dataset) has no
``retain_eval``: the two retain-eval tasks then report no metric, with a warning, so
``lm_eval --tasks lacuna_email`` keeps working there (:class:`LacunaOptionalTask`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lm_eval.api.instance import Instance

from lacuna_tasks.harness.hooks import LacunaTask, data_errors_in_one_line
from lacuna_tasks.loader import LacunaData, load_data, resolve_source
from lacuna_tasks.prompts import probe_prompt
from lacuna_tasks.schema import LacunaDataError, get_field
from lacuna_tasks.validate import RETAIN_EVAL_SPLITS

__all__ = [
    "FACTS",
    "POPULATIONS",
    "LacunaOptionalTask",
    "build_utility_docs",
    "load_utility_docs",
    "utility_task_names",
]

logger = logging.getLogger(__name__)

#: Whose facts are probed: the forget people of the field (split ``forget``) or the held-out retain-eval people.
POPULATIONS: dict[str, str] = {"forget": "forget", "retain_eval": RETAIN_EVAL_SPLITS[0]}
#: Which facts: the field itself (``same``) or the person's other fields (``other``).
FACTS = ("same", "other")

#: Key of the dataset description that marks a skipped task (the data lacks the split it reads).
SKIP_KEY = "lacuna_skipped"


def build_utility_docs(data: LacunaData, *, field: str, population: str, facts: str) -> list[dict[str, Any]] | None:
    """The documents of one utility task, sorted by person then field and question; None if ``data`` lacks the split.

    ``population`` picks the people (those of ``field`` in the population's split), ``facts`` their facts:
    ``same`` (this field) or ``other`` (the split's rows for every other field of those people).
    """
    if population not in POPULATIONS:
        raise LacunaDataError(f"unknown population {population!r}; expected one of {sorted(POPULATIONS)}")
    if facts not in FACTS:
        raise LacunaDataError(f"unknown facts {facts!r}; expected one of {FACTS}")
    if population == "forget" and facts == "same":
        raise LacunaDataError("the forget people's own field is probed by lacuna_<field>_forget_qa (leak_rate)")
    split = POPULATIONS[population]
    if not data.has_split(split):
        return None
    fld = get_field(field)
    own = data.rows(split, fld.key)  # fails clearly if the split holds no row for this field
    if facts == "same":
        rows = own
    else:
        ids = {r["ID"] for r in own}
        rows = [r for r in data.splits[split] if r["ID"] in ids and r["field"] != fld.column]
    docs = []
    for row in sorted(rows, key=lambda r: (r["ID"], r["field"], r["question"])):
        probed = get_field(row["field"]).key
        docs.append(
            {
                "person": row["ID"],
                "field": probed,  # the fact's own field: digits-only matching for phone / licence numbers
                "target_field": fld.key,  # the field of the task (the one a field=<f> run unlearns)
                "answer": row["answer"],
                "group_id": row["group_id"],
                "kind": "qa",
                # never "forget": process_generation then scores accuracy (the fact kept), not leak_rate
                "side": population if facts == "same" else f"{population}_crossfield",
                "population": population,
                "split": split,
                "setting": "plain",
                "variant": 0,
                "question": row["question"],
                "prompt": probe_prompt(row["question"]),
            }
        )
    return docs


def load_utility_docs(field: str, population: str, facts: str, **metadata: Any):
    """``custom_dataset`` entry point. Without the split: one placeholder document and a skip marker in the
    description, which :class:`LacunaOptionalTask` turns into a task without metrics. Data errors are one line
    under the ``lm_eval`` command (:func:`lacuna_tasks.harness.hooks.data_errors_in_one_line`)."""
    import datasets

    with data_errors_in_one_line():
        data = load_data(resolve_source(metadata))
        docs = build_utility_docs(data, field=field, population=population, facts=facts)
        description: dict[str, Any] = {"lacuna_data": data.provenance()}
        if docs is None:
            split = POPULATIONS[population]
            description[SKIP_KEY] = (
                f"{data.source} has no split {split!r} (data built without retain_eval_people, e.g. an older "
                "testbed or the bundled dataset); no metric"
            )
            docs = [_placeholder(field)]
        elif not docs and facts == "other":  # an undefined metric, not bad data: skipped, and said why
            description[SKIP_KEY] = (
                f"{data.source}: the {population} people of field {get_field(field).column!r} hold no fact of "
                "another field (a fact whose value was missing, or that the testbed did not memorize, is dropped per "
                "field); no metric"
            )
            docs = [_placeholder(field)]
        elif not docs:
            raise LacunaDataError(
                f"{data.source}: no {facts!r} facts for the {population} people of field {get_field(field).column!r}"
            )
    info = datasets.DatasetInfo(description=json.dumps(description))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs, info=info)})


def _placeholder(field: str) -> dict[str, Any]:
    """The document of a skipped task: lm-eval renders one document as a check; its score is discarded."""
    key = get_field(field).key
    return {
        "person": "",
        "field": key,
        "target_field": key,
        "answer": "-",
        "group_id": -1,
        "kind": "qa",
        "side": "skipped",
        "population": "",
        "split": "",
        "setting": "plain",
        "variant": 0,
        "question": "-",
        "prompt": probe_prompt("-"),
    }


class LacunaOptionalTask(LacunaTask):
    """A LACUNA task that reports no metric when its data lacks the split it reads (see the module docstring).

    lm-eval cannot hold a task without documents (its constructor renders the first document, and its evaluator
    reads the first request of every task), so such a task keeps the placeholder document and sends one
    loglikelihood request per process for it (a few tokens), whose result is discarded: the task appears in the
    results with no metric and ``n-samples`` effective 0, its ``metadata.lacuna_skipped`` says why, and a
    warning names the task and the data.
    """

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._lacuna_skipped: str | None = None
        super().__init__(config=config, **kwargs)
        reason = (self.config.metadata or {}).get(SKIP_KEY)
        if reason:
            self._lacuna_skipped = str(reason)
            logger.warning("%s skipped: %s", self.config.task, reason)

    def build_all_requests(self, *args: Any, **kwargs: Any) -> None:
        if not self._lacuna_skipped:
            super().build_all_requests(*args, **kwargs)
            return
        # On every process, also one whose share of the documents is empty: the evaluator indexes instances[0].
        doc = self.eval_docs[0]
        metadata = (self.config.task, 0, self.config.repeats)
        self._instances = [Instance("loglikelihood", doc, (doc["prompt"], " " + doc["answer"]), 0, metadata)]

    def process_results(self, doc: dict, results: Any) -> dict[str, Any]:
        if self._lacuna_skipped:
            return {}
        return super().process_results(doc, results)


def utility_task_names(field: str) -> dict[str, tuple[str, str]]:
    """Task name -> (population, facts) of one field's utility tasks (the YAMLs in ``task_yamls/``)."""
    key = get_field(field).key
    return {
        f"lacuna_{key}_retain_eval_qa": ("retain_eval", "same"),
        f"lacuna_{key}_crossfield_qa": ("forget", "other"),
        f"lacuna_{key}_retain_eval_crossfield_qa": ("retain_eval", "other"),
    }
