"""Prompt templates, paraphrases, ICR determinism, answer normalization."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from lacuna_tasks.normalize import digits_only, fact_produced, normalize_text
from lacuna_tasks.prompts import (
    CONTINUATIONS,
    PARAPHRASES,
    PII_TO_MATCH,
    lacuna_question,
    paraphrases,
    person_from_question,
    pick_icr_examples,
    probe_prompt,
    qa_prompt,
)
from lacuna_tasks.schema import FIELDS, LacunaDataError
from lacuna_tasks.seeding import stable_rng, stable_seed

PROFILE = {
    "First Name": "Ada",
    "Last Name": "Quill",
    "Gender": "Female",
    "Age": 41,
    "Email Address": "ada.quill@example.org",
    "Phone Number": "(555) 010-2030",
    "Birth City": "Port Ellis",
    "Driver's License": "US-DL-12345678",
    "Employer": "Quill & Sons",
    "Job Title": "Surveyor",
    "Blood Type": "O+",
    "Passport Number": "N/A",
}


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_fifteen_distinct_paraphrases_per_field(field):
    templates = PARAPHRASES[field]
    assert len(templates) == 15
    filled = paraphrases(field, "Ada Quill", "her")
    assert len(set(filled)) == 15
    assert all("Ada Quill" in q for q in filled)
    # genuinely different questions, not punctuation variants
    folded = {"".join(ch for ch in q.lower() if ch.isalnum()) for q in filled}
    assert len(folded) == 15


def test_every_context_column_has_three_continuations():
    assert set(CONTINUATIONS) == set(PII_TO_MATCH)
    assert all(len(v) == 3 for v in CONTINUATIONS.values())


def test_lacuna_question_format():
    q = lacuna_question(PROFILE, "email", random.Random(0))
    assert q.startswith("Ada Quill, ")
    assert q.endswith(". What is her Email Address?")
    assert "ada.quill@example.org" not in q  # the target never leaks into its own question
    assert "N/A" not in q  # missing values are not used as context
    assert qa_prompt(q) == f"Q: {q}\nA: "
    assert probe_prompt(q) == f"Q: {q}\nA:"


def test_lacuna_question_pronouns():
    male = dict(PROFILE, Gender="Male")
    other = dict(PROFILE, Gender="Non-Binary")
    assert lacuna_question(male, "phone", random.Random(1)).endswith("What is his Phone Number?")
    assert lacuna_question(other, "birth_city", random.Random(1)).endswith("What is their Birth City?")
    assert lacuna_question(PROFILE, "drivers_license", random.Random(1)).endswith("What is her Driver's License?")


def test_person_from_question_round_trip():
    q = lacuna_question(PROFILE, "email", random.Random(3))
    assert person_from_question(q) == ("Ada Quill", "her")
    with pytest.raises(ValueError, match="name"):
        person_from_question("What is the email?")


def test_stable_seed_is_process_independent():
    code = "from lacuna_tasks.seeding import stable_seed; print(stable_seed('p1', 'email', 3))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": seed}
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {str(stable_seed("p1", "email", 3))}


def test_seeding_values_and_old_import_path():
    """Pinned values: a change here changes every generated dataset, prompt and probe (docs/tasks.md)."""
    from lacuna_tasks import prompts

    assert prompts.stable_seed is stable_seed and prompts.stable_rng is stable_rng
    assert stable_seed("p1", "email", 3) == stable_seed("p1", "email", "3") != stable_seed("p1", "email", 4)
    assert stable_rng("a", 1).random() == random.Random(stable_seed("a", 1)).random()
    assert stable_seed("p1", "email", 3) == 6755222653578664534  # first 8 bytes of SHA-256("p1\x1femail\x1f3")


def test_icr_examples_deterministic_and_exclude_the_person():
    pool = [{"ID": f"r{i}", "question": f"q{i}", "answer": f"a{i}"} for i in range(10)] + [
        {"ID": "p1", "question": "own", "answer": "own"}
    ]
    first = pick_icr_examples(pool, "p1", "email", 0)
    assert first == pick_icr_examples(pool, "p1", "email", 0)
    assert len(first) == 3 and ("own", "own") not in first
    assert any(pick_icr_examples(pool, "p1", "email", v) != first for v in range(1, 16))  # fresh per variant
    prompt = probe_prompt("What?", first)
    assert prompt.count("Q: ") == 4 and prompt.endswith("Q: What?\nA:")
    with pytest.raises(ValueError, match="ICR needs 3"):
        pick_icr_examples(pool[:2], "p1", "email", 0)


def test_normalization():
    assert normalize_text("  Ada.QUILL@Example.org \n") == "ada.quill@example.org"
    assert digits_only("+1 (555) 010-2030") == "15550102030"


@pytest.mark.parametrize(
    ("answer", "output", "field", "expected"),
    [
        ("ada.quill@example.org", " Ada.Quill@example.org\n", "email", True),
        ("ada.quill@example.org", "ada.quill@example.com", "email", False),
        ("(555) 010-2030", "call 555-010-2030", "phone", True),  # digits-only match
        ("(555) 010-2030", "555 010 2031", "phone", False),
        ("US-DL-12345678", "license 12345678", "drivers_license", True),
        ("US-DL-12345678", "us-dl-12345678", "Driver's License", True),
        ("Port Ellis", "port  ellis", "birth_city", True),
        ("Port Ellis", "Port Elli", "birth_city", False),
        ("12", "12", "email", True),
    ],
)
def test_fact_produced(answer, output, field, expected):
    assert fact_produced(answer, output, field) is expected


def test_digits_only_needs_a_real_number():
    # 2-digit target digits must not match any output containing them under digits-only comparison
    assert fact_produced("A-1", "x 1 y", "phone") is False


def test_fact_produced_rejects_bad_input():
    with pytest.raises(ValueError, match="empty answer"):
        fact_produced("  ", "anything", "email")
    with pytest.raises(LacunaDataError, match="unknown field 'ssn'"):
        fact_produced("x", "x", "ssn")
