"""Session fixtures: a small LACUNA dataset, a locally trained tokenizer and a tiny causal LM that
has memorized some forget facts (so leaks are real, not mocked). No network anywhere.

Every test under ``tests/e2e/`` is marked ``e2e`` here: the unit phase is ``-m "not e2e"``, the end-to-end phase
``-m e2e`` (``scripts/test.sh``). A test that builds a testbed (``smoke_testbed``), trains through the trainer,
the HF Trainer or lm_eval, spawns a CLI, or needs ``tiny_lacuna`` (it trains a tiny LM, ~25 s of CPU) belongs there.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# caches (activation statistics, file fingerprints) of this test session only: never the user's ~/.cache
os.environ.setdefault("LACUNA_CACHE", tempfile.mkdtemp(prefix="lacuna-test-cache-"))

E2E_DIR = Path(__file__).resolve().parent / "e2e"
MEMORIZED_FORGET_PEOPLE = 2  # forget people (sorted by ID) whose email QA the tiny model learns


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test collected under tests/e2e/ with ``pytest.mark.e2e``, and put every test of the smoke
    testbed in one xdist group: with ``-n N --dist loadgroup`` one worker builds the testbed (minutes), not N."""
    for item in items:
        if Path(item.path).resolve().is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)
        if "smoke_testbed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("smoke_testbed"))


@dataclass
class TinyLacuna:
    data_dir: Path
    model_dir: Path
    leaked_people: list[str]  # forget people whose email the model was trained to produce
    clean_people: list[str]  # forget people never trained on


@pytest.fixture(scope="session")
def tiny_lacuna(tmp_path_factory) -> TinyLacuna:
    from helpers.tiny_lm import train_memorizing_lm

    from lacuna_tasks.prompts import PARAPHRASES, qa_prompt, qa_text, stable_rng
    from lacuna_tasks.synth.generate import bio_texts, build_splits, generate_profiles, write_dataset
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("tiny_lacuna")
    profiles = generate_profiles(48, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=8, validation_people=4)
    data_dir = write_dataset(root / "data", profiles, splits)

    forget_email = sorted((r for r in splits["forget"] if r["field"] == "Email Address"), key=lambda r: r["ID"])
    retain_email = [r for r in splits["retain"] if r["field"] == "Email Address"]
    retain_phone = [r for r in splits["retain"] if r["field"] == "Phone Number"]  # digit answers
    memorized = forget_email[:MEMORIZED_FORGET_PEOPLE]
    train_texts = [qa_prompt(r["question"]) + r["answer"] + "\n" for r in memorized + retain_email + retain_phone]

    rng = stable_rng("tokenizer-corpus")
    corpus = [qa_text(r["question"], r["answer"]) for rows in splits.values() for r in rows]
    corpus += [b for p in profiles for b in bio_texts(p, rng, 1)]
    corpus += [t for templates in PARAPHRASES.values() for t in templates]
    tokenizer = train_tokenizer(corpus)
    model_dir = train_memorizing_lm(train_texts, tokenizer, root / "model")
    return TinyLacuna(
        data_dir=Path(data_dir),
        model_dir=model_dir,
        leaked_people=[r["ID"] for r in memorized],
        clean_people=[r["ID"] for r in forget_email[MEMORIZED_FORGET_PEOPLE:]],
    )


@pytest.fixture(scope="session")
def smoke_testbed(tmp_path_factory) -> Path:
    """The smoke testbed, built once per test session (masked injection, QA tuning, splits).

    ``LACUNA_TEST_SMOKE_TESTBED=DIR`` copies a smoke testbed built beforehand (``lacuna build-testbed --preset
    smoke``) instead: for local runs of a few tests; CI leaves it unset and builds one."""
    import shutil

    from lacuna_unlearn.testbed.build import build_testbed

    out = tmp_path_factory.mktemp("testbeds") / "smoke"
    prebuilt = os.environ.get("LACUNA_TEST_SMOKE_TESTBED")
    if prebuilt:
        return Path(shutil.copytree(prebuilt, out))
    return build_testbed(out, preset="smoke")


@pytest.fixture(scope="session")
def tiny_email_rows(tiny_lacuna) -> tuple[list[dict], list[dict]]:
    """(forget, retain) email QA rows of the tiny model: the forget rows are the memorized people's."""
    from lacuna_tasks.loader import load_data

    data = load_data(tiny_lacuna.data_dir)
    forget = [
        r for r in data.splits["forget"] if r["ID"] in tiny_lacuna.leaked_people and r["field"] == "Email Address"
    ]
    retain = [r for r in data.splits["retain"] if r["field"] == "Email Address"]
    return forget, retain


@pytest.fixture(scope="session")
def forget_nll():
    """``forget_nll(model_dir, rows)``: mean answer-token NLL of a saved checkpoint on QA rows (no grad)."""
    import torch

    from lacuna_unlearn.methods.losses import nll_loss
    from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain

    def compute(model_dir, rows) -> float:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        batch = collate_forget_retain(tok.pad_token_id)([{"forget": x} for x in QADataset(rows, tok)])["forget"]
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return float(nll_loss(logits, batch["labels"]))

    return compute


@pytest.fixture(scope="session")
def leak_and_nll():
    """``leak_and_nll(model_dir, rows)``: greedy extraction leak rate (the testbed's memorization rule) and mean
    answer NLL of a saved checkpoint on QA rows."""
    import torch

    from lacuna_metrics.behaviour.probes import extraction_hits
    from lacuna_tasks.prompts import probe_prompt
    from lacuna_unlearn.methods.losses import nll_loss
    from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain

    def compute(model_dir, rows) -> tuple[float, float]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        prompts = [probe_prompt(r["question"]) for r in rows]
        hits = extraction_hits(model, tok, prompts, [r["answer"] for r in rows], [r["field"] for r in rows])
        batch = collate_forget_retain(tok.pad_token_id)([{"forget": x} for x in QADataset(rows, tok)])["forget"]
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return sum(hits) / len(hits), float(nll_loss(logits, batch["labels"]))

    return compute


@pytest.fixture(scope="session")
def tiny_release(tiny_lacuna, tmp_path_factory):
    """A tiny LACUNA release in the authors' published layout (tests/helpers/release.py): ``<root>/OLMo2-1B/`` with
    ``masked/`` (the tiny memorizing model as W_cpt, its ``mask.pt``, ``intruction_tuned/``), ``unmasked/`` and
    ``data-masked/`` / ``data-unmasked/`` (card and parquet files) from ``tiny_lacuna``'s data. Seconds on top of
    ``tiny_lacuna``."""
    from helpers.release import write_release

    root = tmp_path_factory.mktemp("tiny_release")
    return write_release(root, data_dir=tiny_lacuna.data_dir, model_dir=tiny_lacuna.model_dir)
