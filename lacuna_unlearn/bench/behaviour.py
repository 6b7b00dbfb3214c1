"""``lacuna run``'s evaluation stage and what it reads from it: the behaviour metrics of one evaluation, with
persons and exact intervals over them.

Which lm-eval task and metric each behaviour metric comes from is declared once, in
:data:`lacuna_unlearn.bench.metric_table.BEHAVIOUR_METRICS` (docs/tasks.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lacuna_tasks import NEUTRAL_PPL_TASK
from lacuna_unlearn.bench.metric_table import BEHAVIOUR_METRICS
from lacuna_unlearn.bench.stages import Stages

__all__ = ["BEHAVIOUR_METRICS", "behaviour", "eval_stage"]


def behaviour(
    results: Mapping[str, Mapping[str, float]],
    field: str,
    data: Path | None = None,
    persons: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
) -> dict[str, Any]:
    """The run's behavioural metrics of one evaluation, with ``n`` (persons behind each metric) and, given the
    evaluation's per-person values ``persons`` (task -> metric -> person -> value), ``ci``: per metric the exact 95%
    interval over persons with its ``k``, ``n`` and method (:func:`lacuna_metrics.behaviour.intervals.rate_interval`),
    because a cell of 0 of 5 persons is not a certain 0. ``n`` counts the persons the metric observed when
    ``persons`` is given, else the forget or retain people of ``field`` in ``data`` (lm-eval's ``n-samples``
    counts documents, not persons). ``n`` and ``ci`` are None where the task did not run."""
    from lacuna_metrics import rate_interval

    out: dict[str, Any] = {
        name: results.get(f"lacuna_{field}_{task}", {}).get(metric)
        for name, (task, metric) in BEHAVIOUR_METRICS.items()
    }
    # word perplexity on the testbed's held-out neutral prose (lacuna_neutral_ppl, docs/tasks.md); not per person
    out["neutral_word_perplexity"] = results.get(NEUTRAL_PPL_TASK, {}).get("word_perplexity")
    n: dict[str, int | None] = {}
    if persons is not None:
        ci: dict[str, dict[str, Any] | None] = {}
        for name, (task, metric) in BEHAVIOUR_METRICS.items():
            values = persons.get(f"lacuna_{field}_{task}", {}).get(metric)
            ci[name] = rate_interval(values, metric=name) if values and out[name] is not None else None
            n[name] = len(values) if values and out[name] is not None else None
        out["n"], out["ci"] = n, ci
    elif data is not None:
        from lacuna_tasks import load_data

        loaded = load_data(data)  # cached per path: one read per run
        split_people: dict[str, int] = {}  # side: distinct people of the field in that split
        for name in BEHAVIOUR_METRICS:
            side = "retain" if name.startswith("retain") else "forget"
            if name.endswith("eval_accuracy") or "crossfield" in name:  # counted from persons.json only
                n[name] = None
                continue
            if out[name] is not None and side not in split_people:
                split_people[side] = len({row["ID"] for row in loaded.rows(side, field)})
            n[name] = None if out[name] is None else split_people[side]
        out["n"] = n
    return out


def eval_stage(
    stages: Stages,
    label: str,
    model: Path,
    key: Mapping[str, Any],
    tasks: list[str],
    data: Path,
    cfg: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """lm-eval results of ``model`` (task -> metric -> value) and per-person values (task -> metric -> person ->
    value, from the logged samples), cached as one stage."""
    from lacuna_metrics import per_person_values
    from lacuna_tasks import evaluate

    def build(tmp: Path) -> None:
        out = evaluate(model, tasks, data=data, batch_size=int(cfg["eval"]["batch_size"]))
        persons = {
            task: {metric: per_person_values(out["samples"].get(task, []), metric) for metric in metrics}
            for task, metrics in out["results"].items()
            if task != NEUTRAL_PPL_TASK  # documents, not persons
        }
        (tmp / "results.json").write_text(json.dumps(out["results"], indent=2))
        (tmp / "persons.json").write_text(json.dumps(persons, indent=1, sort_keys=True))

    stage = stages.get("eval", label, {**key, "tasks": tasks, "persons": 1}, build)
    return json.loads((stage / "results.json").read_text()), json.loads((stage / "persons.json").read_text())
