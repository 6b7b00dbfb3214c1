"""Training text of a testbed: PII documents per group, neutral text, QA-tuning pairs.

* PII documents of a group's people: prose bios and QA texts (LACUNA's multi-sentence question +
  answer, concatenated as in LACUNA's training data, docs/definitions.md#profiles-and-pii-fields). Only these are
  masked.
* Neutral text: Faker paragraphs plus bios and QA of *distractor* people who are in no group and no
  split. Neutral steps update every trainable weight and teach the QA format (the prototype found
  injected facts are not answerable as QA without it, ``docs/definitions.md#mini-testbed-notes``).
* QA-tuning pairs: the held-out ``qa_tuning`` people (LACUNA's 150 of 1,200, docs/definitions.md#qa-tuning).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lacuna_tasks.generate import bio_texts, generate_profiles
from lacuna_tasks.prompts import full_name, lacuna_question, qa_prompt, stable_rng
from lacuna_tasks.schema import FIELDS


@dataclass
class TestbedCorpus:
    profiles: list[dict[str, Any]]  # targets (groups 0..5) and qa_tuning people
    distractors: list[dict[str, Any]]
    pii_qa: dict[int, list[str]]
    pii_bio: dict[int, list[str]]
    neutral: list[str]
    qa_tuning: list[tuple[str, str]]  # (prompt ending in "A: ", answer)

    @property
    def targets(self) -> list[dict[str, Any]]:
        return [p for p in self.profiles if p["role"] == "target"]

    def tokenizer_texts(self) -> list[str]:
        texts = list(self.neutral)
        for group in self.pii_qa:
            texts += self.pii_qa[group] + self.pii_bio[group]
        texts += [p + a for p, a in self.qa_tuning]
        return texts


def qa_training_text(question: str, answer: str) -> str:
    """LACUNA's QA training text: the Q/A prompt and the answer concatenated, no separator
    (docs/definitions.md#profiles-and-pii-fields)."""
    return qa_prompt(question) + answer


def build_corpus(
    *,
    profiles_per_group: int,
    distractor_profiles: int,
    bios_per_person: int,
    qa_per_field: int,
    lorem_paragraphs: int,
    num_groups: int = 6,
    seed: int = 42,
) -> TestbedCorpus:
    """All text of a testbed, deterministic for ``seed``."""
    # generate_profiles holds out 12.5% as qa_tuning people; size the draw so each group keeps ~N targets.
    total = math.ceil(num_groups * profiles_per_group / 0.875)
    profiles = generate_profiles(max(total, 12), seed=seed)
    if num_groups != 6:
        raise ValueError(
            f"the testbed uses LACUNA's 6 groups (forget 0,2,4 / retain 1,3,5), got num_groups={num_groups}"
        )
    taken = {full_name(p) for p in profiles} | {p["Email Address"] for p in profiles}
    distractors = [
        d
        for d in generate_profiles(max(distractor_profiles, 12), seed=seed + 7919)
        if full_name(d) not in taken and d["Email Address"] not in taken
    ][:distractor_profiles]

    pii_qa: dict[int, list[str]] = {g: [] for g in range(num_groups)}
    pii_bio: dict[int, list[str]] = {g: [] for g in range(num_groups)}
    for p in profiles:
        if p["role"] != "target":
            continue
        g = int(p["group_id"])
        pii_bio[g] += bio_texts(p, stable_rng(seed, "bio", p["Unique ID"]), bios_per_person)
        pii_qa[g] += _qa_texts(p, qa_per_field, seed, "train-qa")

    neutral: list[str] = []
    for d in distractors:
        neutral += bio_texts(d, stable_rng(seed, "distractor-bio", d["Unique ID"]), bios_per_person)
        neutral += _qa_texts(d, max(2, qa_per_field // 2), seed, "distractor-qa")
    neutral += _lorem(lorem_paragraphs, seed)
    rng = stable_rng(seed, "neutral-order")
    rng.shuffle(neutral)

    qa_tuning = []
    for p in profiles:
        if p["role"] != "qa_tuning":
            continue
        for key, fld in FIELDS.items():
            if str(p.get(fld.column, "N/A")) in {"N/A", ""}:
                continue
            for i in range(10):  # LACUNA: 10 prompts per field and person (docs/definitions.md#qa-tuning)
                question = lacuna_question(p, key, stable_rng(seed, "qa-tuning", p["Unique ID"], key, i))
                qa_tuning.append((qa_prompt(question), p[fld.column]))
    return TestbedCorpus(profiles, distractors, pii_qa, pii_bio, neutral, qa_tuning)


def _qa_texts(profile: dict[str, Any], per_field: int, seed: int, purpose: str) -> list[str]:
    texts = []
    for key, fld in FIELDS.items():
        answer = str(profile.get(fld.column, "N/A"))
        if answer in {"N/A", ""}:
            continue
        for i in range(per_field):
            question = lacuna_question(profile, key, stable_rng(seed, purpose, profile["Unique ID"], key, i))
            texts.append(qa_training_text(question, answer))
    return texts


def _lorem(n: int, seed: int) -> list[str]:
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    return [fake.paragraph(nb_sentences=6) for _ in range(n)]


def memorization_questions(profile: dict[str, Any], field: str, k: int, seed: int) -> list[str]:
    """``k`` fresh multi-sentence questions used to test whether a fact was memorized
    (docs/definitions.md#memorization-test-and-splits)."""
    out: list[str] = []
    for i in range(4 * k):
        q = lacuna_question(profile, field, stable_rng(seed, "memorization", profile["Unique ID"], field, i))
        if q not in out:
            out.append(q)
        if len(out) == k:
            break
    return out


def pack(token_lists: Sequence[list[int]], eos_id: int, seq_len: int) -> list[list[int]]:
    """Concatenate documents (EOS after each) and cut into rows of exactly ``seq_len`` tokens."""
    stream: list[int] = []
    for ids in token_lists:
        stream += ids + [eos_id]
    return [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
