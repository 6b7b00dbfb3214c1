"""``lacuna_neutral_ppl``: the held-out neutral file's name and lookup, the perplexity ratio and its rule. Through the
real ``lm_eval`` CLI on the smoke testbed: tests/e2e/test_neutral_ppl_eval.py.
"""

from __future__ import annotations

import json

import pytest

from lacuna_tasks.harness.perplexity import (
    NEUTRAL_HELDOUT_FILE,
    TASK,
    neutral_heldout_path,
    perplexity_ratio,
    read_neutral_heldout,
    word_perplexity_ratio,
)
from lacuna_tasks.loader import BUNDLED_NAME
from lacuna_tasks.schema import LacunaDataError


def test_same_file_name_as_the_testbed_builder():
    from lacuna_unlearn.testbed.build import NEUTRAL_HELDOUT_FILE as BUILDER_FILE

    assert NEUTRAL_HELDOUT_FILE == BUILDER_FILE


def test_file_lookup_and_bad_files(tmp_path):
    testbed = tmp_path / "tb"
    (testbed / "data").mkdir(parents=True)
    with pytest.raises(LacunaDataError, match=NEUTRAL_HELDOUT_FILE):
        neutral_heldout_path(testbed / "data")
    with pytest.raises(LacunaDataError, match=f"the bundled dataset: no {NEUTRAL_HELDOUT_FILE}"):
        neutral_heldout_path(BUNDLED_NAME)
    file = testbed / "data" / NEUTRAL_HELDOUT_FILE
    file.write_text('{"text": "one two three"}\n\n{"text": "four"}\n')
    assert neutral_heldout_path(testbed / "data") == file.resolve()
    assert neutral_heldout_path(testbed) == file.resolve()  # a testbed directory: its data/
    assert read_neutral_heldout(file) == ["one two three", "four"]
    for text, message in [
        ("", "holds no documents"),
        ('{"text": "a"}\n{"txt": "b"}\n', ":2: expected an object with a string 'text'"),
        ('{"text": " \\n "}\n', ":1: empty 'text'"),
        ("{not json\n", ":1: malformed JSON"),
    ]:
        file.write_text(text)
        with pytest.raises(LacunaDataError, match=message):
            read_neutral_heldout(file)


def _fake(value: float, fingerprint: str = "sha256:x", suffix: str = ",none") -> dict:
    return {
        "results": {TASK: {f"word_perplexity{suffix}": value, f"word_perplexity_stderr{suffix}": "N/A"}},
        "configs": {TASK: {"metadata": {"lacuna_neutral_heldout": {"fingerprint": fingerprint}}}},
    }


def test_ratio_helper(tmp_path):
    assert perplexity_ratio(_fake(10.0), _fake(15.0)) == pytest.approx(1.5)
    assert perplexity_ratio(_fake(10.0), _fake(5.0, suffix="")) == pytest.approx(0.5)  # evaluate() keys
    path = tmp_path / "before.json"
    path.write_text(json.dumps(_fake(4.0)))
    assert perplexity_ratio(path, _fake(4.0)) == 1.0
    with pytest.raises(LacunaDataError, match="different held-out text"):
        perplexity_ratio(_fake(10.0), _fake(15.0, fingerprint="sha256:y"))
    with pytest.raises(KeyError, match=f"no results for task '{TASK}'"):
        perplexity_ratio({"results": {}}, _fake(1.0))
    with pytest.raises(ValueError, match="finite positive"):
        perplexity_ratio(_fake(10.0), _fake(float("inf")))
    with pytest.raises(FileNotFoundError, match="before: no lm-eval results file"):
        perplexity_ratio(tmp_path / "missing.json", _fake(1.0))
    with pytest.raises(ValueError, match="unknown perplexity metric"):
        perplexity_ratio(_fake(1.0), _fake(1.0), metric="acc")
    assert perplexity_ratio(_fake(3.0), _fake(10.0)) == round(10.0 / 3.0, 6)  # the rounding of lacuna run


def test_word_perplexity_ratio_rule():
    """The rule lacuna run's behaviour.neutral_ppl_ratio uses: rounded to 6 decimals, None without a baseline."""
    assert word_perplexity_ratio(15.0, 10.0) == 1.5
    assert word_perplexity_ratio(10.0, 3.0) == 3.333333
    assert word_perplexity_ratio(0.0, 4.0) == 0.0
    assert word_perplexity_ratio(None, 4.0) is None
    assert word_perplexity_ratio(4.0, None) is None
    assert word_perplexity_ratio(4.0, 0.0) is None
