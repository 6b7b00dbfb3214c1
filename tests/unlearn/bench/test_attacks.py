"""Relearning attacks without a model: the unrelated QA rows, hold-out splits, the resurfacing sets and the
relearning presets' frozen embeddings. The attacker's rows on real data and the real attack runs:
tests/e2e/test_attack_runs.py.
"""

from __future__ import annotations

import pytest

from lacuna_tasks.loader import load_data
from lacuna_unlearn.trainer.relearn_rows import attack_rows, holdout, unrelated_qa


def test_unrelated_qa_is_correct_and_deterministic(tmp_path):
    rows = unrelated_qa(40, seed=1)
    assert rows == unrelated_qa(40, seed=1) and rows != unrelated_qa(40, seed=2)
    for r in rows:
        q, a = r["question"], r["answer"]
        if " plus " in q:
            x, y = q.removeprefix("What is ").removesuffix("?").split(" plus ")
            assert int(a) == int(x) + int(y)
        elif " times " in q:
            x, y = q.removeprefix("What is ").removesuffix("?").split(" times ")
            assert int(a) == int(x) * int(y)
        elif "backwards" in q:
            assert a[::-1] in q
    file = tmp_path / "mine.jsonl"
    file.write_text('{"question": "Q1?", "answer": "A1"}\n{"question": "Q2?", "answer": "A2"}\n')
    data = load_data(None)  # bundled data; with a file the data source does not matter
    assert [r["answer"] for r in attack_rows(data, "unrelated", "email", unrelated_file=file)] == ["A1", "A2"]


def test_holdout_splits_deterministically():
    rows = [{"i": i} for i in range(10)]
    train, held = holdout(rows, 0.2, seed=5)
    assert len(train) == 8 and len(held) == 2 and (train, held) == holdout(rows, 0.2, seed=5)
    assert sorted(r["i"] for r in train + held) == list(range(10))
    assert holdout(rows, 0.0) == (rows, [])
    train, held = holdout(rows[:2], 0.01)
    assert len(train) == 1 and len(held) == 1  # a split keeps at least one row on each side


def test_resurfacing_sets_follow_the_spec():
    from lacuna_unlearn.bench.attacks import resurfacing

    unlearned = {"a": True, "b": False, "c": False, "d": False}
    relearned = {"a": True, "b": True, "c": False, "d": True}
    out = resurfacing(unlearned, relearned)
    assert out["forgotten"] == ["b", "c", "d"] and out["resurfaced"] == ["b", "d"]
    assert out["pct_resurfaced_of_forgotten"] == pytest.approx(100 * 2 / 3)
    assert out["success_at_n_unlearned"] == 0.25 and out["success_at_n_relearned"] == 0.75
    assert resurfacing({"a": True}, {"a": True})["pct_resurfaced_of_forgotten"] == 0.0  # max(1, |forgotten|)
    with pytest.raises(ValueError, match="different persons"):
        resurfacing({"a": True}, {"b": True})


# -- frozen input embeddings (LACUNA's relearning freezes embed_tokens) ------------------------------------------
# docs/definitions.md#masked-continual-pretraining


def _compose(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        return compose(config_name="unlearn", overrides=list(overrides))


@pytest.mark.parametrize("preset", ["relearn", "relearn_lora", "relearn_frag", "relearn_restricted"])
def test_every_relearning_preset_freezes_the_input_embeddings(preset):
    assert _compose(f"attack={preset}", "output_dir=x").freeze_embeddings is True
    assert _compose(f"attack={preset}", "output_dir=x", "freeze_embeddings=false").freeze_embeddings is False
    assert _compose("method=grad_diff", "output_dir=x").freeze_embeddings is False  # unlearning methods unchanged
