"""What a freshly built testbed model knows, before any unlearning: the memorization test that picks the split
people, and the robustness test of their facts under the evaluation probes (docs/testbeds.md,
docs/definitions.md#memorization-test-and-splits)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from lacuna_metrics import extraction_hits
from lacuna_tasks import (
    FIELDS,
    FORGET_GROUPS,
    RETAIN_GROUPS,
    full_name,
    paraphrases,
    pick_icr_examples,
    possessive,
    probe_prompt,
    progress,
)
from lacuna_unlearn.testbed.corpus import TestbedCorpus, memorization_questions
from lacuna_unlearn.testbed.presets import TestbedConfig

__all__ = ["ROBUSTNESS_SPLITS", "memorization_test", "robustness_test", "share"]


def memorization_test(
    net, tokenizer, corpus: TestbedCorpus, cfg: TestbedConfig, *, desc: str = "memorization test"
) -> tuple[dict[tuple[str, str], list[str]], dict[str, Any]]:
    """Greedy extraction of ``memorization_prompts`` fresh questions per target person and field.

    Returns the memorized questions per (person, field) for the split builder, and per field the share
    of forget-group / retain-group people who are ``eligible`` (>= 2 memorized questions, LACUNA's rule)
    and ``extractable`` (>= 1), plus the share of correct prompts, overall and per group.
    """
    items = []
    for person in corpus.targets:
        for key, fld in FIELDS.items():
            answer = str(person.get(fld.column, "N/A"))
            if answer in {"N/A", ""}:
                continue
            for q in memorization_questions(person, key, cfg.memorization_prompts, cfg.seed):
                items.append((person, key, q, answer))
    prompts = [probe_prompt(q) for _, _, q, _ in items]
    hits = _hits_with_progress(
        net, tokenizer, prompts, [i[3] for i in items], [i[1] for i in items], cfg.eval_batch,
        desc,
    )  # fmt: skip
    memorized: dict[tuple[str, str], list[str]] = defaultdict(list)
    correct: dict[tuple[str, str], int] = defaultdict(int)
    asked: dict[tuple[str, str], int] = defaultdict(int)
    group_of = {}
    for (person, key, q, _), hit in zip(items, hits, strict=True):
        pid = person["Unique ID"]
        group_of[pid] = int(person["group_id"])
        asked[(pid, key)] += 1
        if hit:
            memorized[(pid, key)].append(q)
            correct[(pid, key)] += 1
    report: dict[str, Any] = {"prompts_per_person_field": cfg.memorization_prompts}
    for key in FIELDS:
        people = [(pid, g) for (pid, k) in asked for g in [group_of[pid]] if k == key]
        row: dict[str, Any] = {}
        for side, groups in (("forget", FORGET_GROUPS), ("retain", RETAIN_GROUPS)):
            ids = [pid for pid, g in people if g in groups]
            row[side] = {
                "people": len(ids),
                "eligible": share(sum(correct[(p, key)] >= 2 for p in ids), len(ids)),
                "extractable": share(sum(correct[(p, key)] >= 1 for p in ids), len(ids)),
                "prompt_accuracy": share(sum(correct[(p, key)] for p in ids), sum(asked[(p, key)] for p in ids)),
            }
        row["by_group"] = {
            str(g): share(
                sum(correct[(p, key)] >= 2 for p, gg in people if gg == g), sum(1 for _, gg in people if gg == g)
            )
            for g in range(cfg.num_groups)
        }
        report[key] = row
    return dict(memorized), report


#: Splits whose people the robustness test probes (those present in the splits given).
ROBUSTNESS_SPLITS = ("forget", "retain_eval")


def robustness_test(
    net,
    tokenizer,
    corpus: TestbedCorpus,
    splits: dict[str, list[dict[str, Any]]],
    cfg: TestbedConfig,
    *,
    desc: str = "robustness test (paraphrase, ICR)",
) -> dict[str, Any]:
    """How robustly the split people's facts are known before unlearning, with the lm-eval probes' prompts.

    Per split and field, for up to ``robustness_people`` people: the 15 evaluation paraphrases (none of which is
    in the injected text; the split's own question is left out, it is a trained template) and the same 15 after
    3 retain QA pairs of other people (ICR). Reports ``j_p`` / ``j_icr`` (share of people answering under at
    least one probe: JensUn's worst case, the forget side's bar) and ``paraphrase_accuracy`` /
    ``icr_accuracy`` (share of correct probes: the retain side's ``j_avg``).
    """
    profiles = {p["Unique ID"]: p for p in corpus.profiles}
    items: list[tuple[str, str, str, str, str, str]] = []  # split, field, person, setting, prompt, answer
    for split in ROBUSTNESS_SPLITS:
        for key, fld in FIELDS.items():
            rows = sorted((r for r in splits.get(split, ()) if r["field"] == fld.column), key=lambda r: r["ID"])
            pool = [r for r in splits.get("retain", ()) if r["field"] == fld.column]
            for row in rows[: cfg.robustness_people]:
                person = profiles[row["ID"]]
                # the 15 evaluation paraphrases only: the split's own question is a LACUNA template the model was
                # trained on, and would make J_P the plain extractability (variant numbers as the lm-eval tasks')
                questions = paraphrases(key, full_name(person), possessive(person.get("Gender")))
                for variant, question in enumerate(questions, start=1):
                    items.append((split, key, row["ID"], "paraphrase", probe_prompt(question), row["answer"]))
                    if len(pool) > 3:
                        examples = pick_icr_examples(pool, row["ID"], key, variant, 3)
                        items.append((split, key, row["ID"], "icr", probe_prompt(question, examples), row["answer"]))
    hits = _hits_with_progress(
        net, tokenizer, [i[4] for i in items], [i[5] for i in items], [i[1] for i in items], cfg.eval_batch,
        desc,
    )  # fmt: skip
    per: dict[tuple[str, str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for (split, key, pid, setting, _, _), hit in zip(items, hits, strict=True):
        per[(split, key, setting)][pid].append(hit)
    report: dict[str, Any] = {
        "people_per_split_field": cfg.robustness_people,
        "probes_per_person": 15,
        "probes": "the 15 evaluation paraphrases (not the split question), alone and after 3 retain QA pairs",
    }
    for split in ROBUSTNESS_SPLITS:
        by_field: dict[str, Any] = {}
        for key in FIELDS:
            entry: dict[str, Any] = {}
            for setting, worst, avg in (("paraphrase", "j_p", "paraphrase_accuracy"), ("icr", "j_icr", "icr_accuracy")):
                people = per.get((split, key, setting), {})
                if not people:
                    continue
                entry["people"] = len(people)
                entry[worst] = share(sum(any(h) for h in people.values()), len(people))
                entry[avg] = share(sum(sum(h) for h in people.values()), sum(len(h) for h in people.values()))
            if entry:
                by_field[key] = entry
        if by_field:
            report[split] = by_field
    return report


def _hits_with_progress(
    net, tokenizer, prompts: list[str], answers: list[str], fields: list[str], batch_size: int, desc: str
) -> list[bool]:
    """``extraction_hits`` batch by batch under a progress bar named ``desc``. The prompts go in the order and
    batches ``greedy_generate`` forms itself (shortest first, stable), so every generation is the same as in one
    call."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    hits = [False] * len(prompts)
    with progress(total=len(prompts), desc=desc, unit="prompt") as bar:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            found = extraction_hits(
                net,
                tokenizer,
                [prompts[i] for i in idx],
                [answers[i] for i in idx],
                [fields[i] for i in idx],
                batch_size=batch_size,
            )
            for i, hit in zip(idx, found, strict=True):
                hits[i] = hit
            bar.update(len(idx))
    return hits


def share(n: int, d: int) -> float | None:
    """``n / d`` rounded to 4 places, None for an empty population (a manifest rate, not a zero)."""
    return round(n / d, 4) if d else None
