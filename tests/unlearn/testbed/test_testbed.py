"""The testbed's corpus, presets and settings without a build: training question forms, mini QA documents, the
neutral held-out text, fitting people, bad settings refused before any work. Builds (the smoke testbed and the
others): tests/e2e/test_testbed_build.py.
"""

from __future__ import annotations

import pytest

from lacuna_tasks.schema import FIELDS, RETAIN_GROUPS
from lacuna_unlearn.testbed.presets import get_preset


def test_unknown_preset_and_setting():
    with pytest.raises(ValueError, match="unknown testbed preset 'huge'"):
        get_preset("huge")
    with pytest.raises(ValueError, match="unknown testbed setting"):
        get_preset("smoke", hidden=3)


def test_training_question_forms_are_never_probe_questions():
    """The injected text may use many question forms, but never one of the evaluation paraphrases (the probes of
    J_P / J_ICR), for any person."""
    from lacuna_tasks.prompts import PARAPHRASES, full_name, paraphrases, possessive
    from lacuna_unlearn.testbed.build import TRAIN_QUESTION_FORMS, with_training_question_forms
    from lacuna_unlearn.testbed.corpus import build_corpus

    for key in FIELDS:
        assert set(TRAIN_QUESTION_FORMS[key]).isdisjoint(PARAPHRASES[key]), key
    corpus = build_corpus(profiles_per_group=2, distractor_profiles=4, bios_per_person=1, qa_per_field=2,
                          lorem_paragraphs=4, seed=5)  # fmt: skip
    varied = with_training_question_forms(corpus, per_field=len(TRAIN_QUESTION_FORMS["email"]), block=3, seed=5)
    lines = {
        line for texts in varied.pii_qa.values() for t in texts for line in t.split("\n") if line.startswith("Q: ")
    }
    assert len(lines) > sum(len(t) for t in corpus.pii_qa.values())  # the forms were added
    probes = {
        f"Q: {q}" for p in corpus.targets for k in FIELDS for q in paraphrases(k, full_name(p), possessive(p["Gender"]))
    }
    assert lines.isdisjoint(probes)
    assert any(t.count("Q: ") == 3 for texts in varied.pii_qa.values() for t in texts)  # ICR-shaped blocks


def test_mini_qa_documents_have_the_icr_prompt_layout():
    """``mini`` injects two QA pairs per document (``qa_block: 2``): the layout of an ICR prompt, so the model has
    answered a question that follows another person's pair (docs/testbeds.md 'ICR-shaped QA documents')."""
    from lacuna_tasks.prompts import qa_text
    from lacuna_unlearn.testbed.corpus import testbed_corpus
    from lacuna_unlearn.testbed.presets import get_preset

    cfg = get_preset("mini")
    assert cfg.qa_block == 2
    corpus, _ = testbed_corpus(cfg)
    for group, docs in corpus.pii_qa.items():
        assert all(d.count("Q: ") == 2 for d in docs[:-1]), group  # only a group's last document may hold one
        first = docs[0].split("\nQ: ")[0]
        question, answer = first.removeprefix("Q: ").split("\nA: ")
        assert docs[0].startswith(qa_text(question, answer))  # the first pair reads as an ICR example


def test_neutral_heldout_is_never_trained():
    from lacuna_unlearn.testbed.build import hold_out_neutral
    from lacuna_unlearn.testbed.corpus import build_corpus

    corpus = build_corpus(profiles_per_group=2, distractor_profiles=4, bios_per_person=1, qa_per_field=2,
                          lorem_paragraphs=40, seed=5)  # fmt: skip
    kept, heldout = hold_out_neutral(corpus, 0.1, seed=5)
    assert len(heldout) == round(0.1 * len(corpus.neutral)) and set(heldout).isdisjoint(kept.neutral)
    assert sorted(heldout + kept.neutral) == sorted(corpus.neutral)
    assert not set(heldout) & set(kept.tokenizer_texts())
    assert hold_out_neutral(corpus, 0.1, seed=5)[1] == heldout


BAD_SETTINGS = [
    (["hidden=3"], "unknown testbed setting"),
    (["pii_steps=abc"], "pii_steps: expected an integer"),
    (["pii_steps=2.5"], "pii_steps: expected an integer"),
    (["budget=-0.1"], "budget=-0.1 out of range: allowed 0 < budget <= 1"),
    (["budget=1.5"], "budget=1.5 out of range: allowed 0 < budget <= 1"),
    (["people_per_field=500"], "<= 3 \\* profiles_per_group"),
    (["neutral_every=-1"], "neutral_every=-1 out of range"),
    (["weight_decay=true"], "weight_decay: expected a number"),
    (["step_mix=mixed"], "step_mix='mixed': allowed \\['interleaved', 'all_groups'\\]"),
    (["neutral_loss_scale=0"], "neutral_loss_scale=0(\\.0)? out of range: allowed 0 < neutral_loss_scale <= 1"),
    (["neutral_per_step=-1"], "neutral_per_step=-1 out of range"),
    (["step_mix=all_groups", "neutral_optimizer=separate"], "all_groups' needs neutral_optimizer='shared'"),
    (["step_mix=all_groups", "neutral_optimizer=shared", "grad_accum=2"], "leave grad_accum at 1"),
    (["step_mix=all_groups", "neutral_optimizer=shared", "outside_slot=true"], "outside_slot=true is for step_mix="),
    (["outside_slot=false", "outside_batch=4"], "outside_batch=4 needs outside_slot=true"),
    (["outside_slot=true", "outside_batch=0"], "outside_batch=0 out of range"),
    (["leak_audit_target=everything"], "leak_audit_target='everything': allowed \\['all', "),
]


@pytest.mark.parametrize(("settings", "message"), BAD_SETTINGS)
def test_bad_settings_are_refused_before_any_work(tmp_path, capsys, settings, message):
    import re

    from lacuna_unlearn.bench.cli.main import main

    out = tmp_path / "tb"
    argv = ["build-testbed", "--preset", "smoke", "--out", str(out)]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(message, err), err
    assert len(err.splitlines()) == 1
    assert not out.exists() and not out.with_name("tb.partial").exists()


def test_fit_people_takes_the_largest_counts_that_fit():
    """Too few memorized people for the requested counts: the build fails, or with ``fit_people`` takes fewer and
    says so (requested vs used)."""
    from lacuna_unlearn.testbed.build import TestbedError as BuildError
    from lacuna_unlearn.testbed.build import testbed_splits
    from lacuna_unlearn.testbed.corpus import build_corpus

    corpus = build_corpus(profiles_per_group=6, distractor_profiles=2, bios_per_person=1, qa_per_field=1,
                          lorem_paragraphs=2, seed=4)  # fmt: skip
    retain_side = [p for p in corpus.targets if p["group_id"] in RETAIN_GROUPS]
    dropped = {p["Unique ID"] for p in retain_side[: len(retain_side) // 2]}
    memorized = {
        (p["Unique ID"], key): [f"q1 {p['Unique ID']} {key}", f"q2 {p['Unique ID']} {key}"]
        for p in corpus.targets
        if p["Unique ID"] not in dropped
        for key in FIELDS
    }
    cfg = get_preset(
        "smoke", profiles_per_group=6, people_per_field=8, retain_eval_people=4, validation_people=1, fit_people=False
    )
    with pytest.raises(BuildError, match="memorized too little"):
        testbed_splits(corpus, cfg, memorized, {})
    splits, counts = testbed_splits(corpus, cfg.replace(fit_people=True), memorized, {})
    assert counts["shortfall"] and counts["requested"]["people_per_field"] == 8
    used = counts["used"]
    assert 1 <= used["people_per_field"] < 8 and 1 <= used["retain_eval_people"] <= 4
    assert len({r["ID"] for r in splits["forget"] if r["field"] == "Email Address"}) == used["people_per_field"]


def test_neutral_heldout_is_prose_never_qa():
    """The perplexity probe's slice holds lorem paragraphs and distractor bios, never the distractors' QA pairs,
    and none of it stays in the training text."""
    from lacuna_unlearn.testbed.build import hold_out_neutral
    from lacuna_unlearn.testbed.corpus import build_corpus

    corpus = build_corpus(profiles_per_group=1, distractor_profiles=6, bios_per_person=2, qa_per_field=4,
                          lorem_paragraphs=20, num_groups=6, seed=3)  # fmt: skip
    assert any("\nA:" in d for d in corpus.neutral)
    kept, held = hold_out_neutral(corpus, 0.2, seed=3)
    assert held and not any("\nA:" in d for d in held)
    assert len(held) + len(kept.neutral) == len(corpus.neutral) and not set(held) & set(kept.neutral)
    assert hold_out_neutral(corpus, 0.2, seed=3)[1] == held
