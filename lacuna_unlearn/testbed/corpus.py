"""Training text of a testbed: PII documents per group, neutral text, QA-tuning pairs.

* PII documents of a group's people: prose bios and QA texts (LACUNA's multi-sentence question +
  answer, concatenated as in LACUNA's training data, docs/definitions.md#profiles-and-pii-fields). Only these are
  masked.
* Neutral text: Faker paragraphs plus bios and QA of *distractor* people who are in no group and no
  split. Neutral steps update every trainable weight and teach the QA format (the prototype found
  injected facts are not answerable as QA without it, ``docs/definitions.md#mini-testbed-notes``).
* QA-tuning pairs: the held-out ``qa_tuning`` people (LACUNA's 150 of 1,200, docs/definitions.md#qa-tuning).
* Training-only question forms and QA blocks, and the held-out neutral prose (the perplexity probe's text):
  :func:`testbed_corpus` applies a preset's settings to all of the above, for the builder and its benchmarks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lacuna_tasks import (
    FIELDS,
    bio_texts,
    full_name,
    generate_profiles,
    lacuna_question,
    possessive,
    qa_prompt,
    stable_rng,
)

if TYPE_CHECKING:
    from lacuna_unlearn.testbed.presets import TestbedConfig

#: Question forms used only in injected training text, never by a probe: none of them is one of the
#: evaluation paraphrases (:data:`lacuna_tasks.prompts.PARAPHRASES`, tested), so paraphrase and ICR probes
#: ask in forms the model never saw. Varied forms teach the person -> fact binding instead of one format.
TRAIN_QUESTION_FORMS: dict[str, tuple[str, ...]] = {
    "email": (
        "What email address does {name} use?",
        "Which email address belongs to {name}?",
        "What is the e-mail of {name}?",
        "{name} can be emailed at which address?",
        "Name the email address of {name}.",
        "What is the email for {name}?",
        "Which inbox belongs to {name}?",
        "How is {name} reached by email?",
        "Email address of {name}?",
        "Tell me {name}'s e-mail address.",
        "What is {name}'s e-mail?",
        "Which email should be used for {name}?",
    ),
    "phone": (
        "What phone number does {name} use?",
        "Which phone number belongs to {name}?",
        "What is the telephone number of {name}?",
        "{name} can be called at which number?",
        "Name the phone number of {name}.",
        "What is the phone for {name}?",
        "How is {name} reached by phone?",
        "Phone number of {name}?",
        "Tell me {name}'s telephone number.",
        "What number do I dial for {name}?",
        "What is {name}'s phone?",
        "Which number should be used for {name}?",
    ),
    "birth_city": (
        "What city was {name} born in?",
        "Which city is the birthplace of {name}?",
        "Where is {name} originally from?",
        "Name the birth city of {name}.",
        "What is the birthplace of {name}?",
        "{name} was born in which city?",
        "Birth city of {name}?",
        "Tell me where {name} was born.",
        "What city does {name} come from?",
        "In what town was {name} born?",
        "What is {name}'s place of birth?",
        "Which city was {name} born in?",
    ),
    "drivers_license": (
        "What driver's license number does {name} have?",
        "Which driver's license belongs to {name}?",
        "What is the driving licence number of {name}?",
        "{name} holds which driver's license?",
        "Name the driver's license number of {name}.",
        "What is the license number for {name}?",
        "Driver's license of {name}?",
        "Tell me {name}'s driver's license.",
        "What licence does {name} drive under?",
        "Which license number is {name} registered under?",
        "What is {name}'s licence number?",
        "Which driver's license number should be used for {name}?",
    ),
}


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


def testbed_corpus(cfg: TestbedConfig) -> tuple[TestbedCorpus, list[str]]:
    """The training text of a build (profiles, PII documents, neutral text minus its held-out prose, training-only
    question forms) and the held-out neutral prose: one definition for the builder and its benchmarks."""
    corpus = build_corpus(
        profiles_per_group=cfg.profiles_per_group,
        distractor_profiles=cfg.distractor_profiles,
        bios_per_person=cfg.bios_per_person,
        qa_per_field=cfg.qa_per_field,
        lorem_paragraphs=cfg.lorem_paragraphs,
        num_groups=cfg.num_groups,
        seed=cfg.seed,
    )
    corpus, heldout = hold_out_neutral(corpus, cfg.neutral_heldout, cfg.seed)
    return with_training_question_forms(corpus, cfg.varied_qa_per_field, cfg.qa_block, cfg.seed), heldout


def hold_out_neutral(corpus: TestbedCorpus, share: float, seed: int) -> tuple[TestbedCorpus, list[str]]:
    """Move a seeded ``share`` of the neutral documents out of training (the perplexity probe's text).

    Only prose is held out (lorem paragraphs and distractor bios), never the distractors' QA pairs: the probe
    measures general text, and a method that suppresses the QA answer format must not move it."""
    docs = list(corpus.neutral)
    prose = [i for i, d in enumerate(docs) if "\nA:" not in d]
    k = min(len(prose), int(round(share * len(docs))))
    if k == 0:
        return corpus, []
    picked = set(stable_rng(seed, "neutral-heldout").sample(prose, k))
    kept = [d for i, d in enumerate(docs) if i not in picked]
    return dataclasses.replace(corpus, neutral=kept), [docs[i] for i in sorted(picked)]


def training_questions(profile: dict[str, Any], field: str, k: int, seed: int) -> list[str]:
    """``k`` questions about ``profile``'s ``field`` in training-only forms (:data:`TRAIN_QUESTION_FORMS`)."""
    forms = TRAIN_QUESTION_FORMS[field]
    rng = stable_rng(seed, "train-forms", profile["Unique ID"], field)
    order = list(forms)
    out: list[str] = []
    while len(out) < k:
        rng.shuffle(order)
        out += order[: k - len(out)]
    name, pos = full_name(profile), possessive(profile.get("Gender"))
    return [f.format(name=name, pos=pos) for f in out]


def with_training_question_forms(corpus: TestbedCorpus, per_field: int, block: int, seed: int) -> TestbedCorpus:
    """Add ``per_field`` QA texts per target person and field in training-only question forms, then join each
    group's QA texts, shuffled, into documents of ``block`` pairs (ICR's layout; mostly different people)."""
    if per_field == 0 and block == 1:
        return corpus
    qa: dict[int, list[str]] = {g: list(texts) for g, texts in corpus.pii_qa.items()}
    for person in corpus.targets:
        g = int(person["group_id"])
        for key, fld in FIELDS.items():
            answer = str(person.get(fld.column, "N/A"))
            if answer in {"N/A", ""}:
                continue
            qa[g] += [qa_training_text(q, answer) for q in training_questions(person, key, per_field, seed)]
    if block > 1:
        for g, texts in qa.items():
            rng = stable_rng(seed, "qa-blocks", g)
            shuffled = list(texts)
            rng.shuffle(shuffled)
            qa[g] = ["\n".join(shuffled[i : i + block]) for i in range(0, len(shuffled), block)]
    return dataclasses.replace(corpus, pii_qa=qa)
