"""The bad-input suite through real processes: a few of the ``CASES`` of
tests/unlearn/bench/cli/test_bad_input_cli.py (tests/helpers/bad_input_cases.py) through the ``lacuna`` console
script, to prove the no-traceback property end to end, and bad data through the real ``lm_eval`` command.
``SHOW_ERRORS=1 pytest -s -k lm_eval`` prints the lm-eval messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.bad_input_cases import (
    BIN,
    CASES,
    Inputs,
    _left_behind,
    build_inputs,
)

# -- end to end: the console scripts ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    return build_inputs(tmp_path_factory.mktemp("bad_input"))


def _script(*argv: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=300, env=env)
    return result, time.perf_counter() - started


@pytest.mark.parametrize(
    "case_id",
    [
        "missing-path/score-after",
        "unknown-key/attack-set-attack.attempts",
        "bad-value/attack-attempts-abc",
        "bad-value/diagnose-n",
        "malformed-json/gate-results",
        "bad-masks/bit-beyond-num-groups",
    ],
)
def test_console_script_refuses_without_traceback(case_id, inputs, tmp_path):
    case = CASES[case_id]
    out = tmp_path / "out"
    result, _ = _script(str(BIN / "lacuna"), *case.argv(inputs, out))
    assert result.returncode == case.code, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for culprit in case.named(inputs, out):
        assert culprit in result.stderr, (culprit, result.stderr[-2000:])
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not _left_behind(out)


def _tiny_hf_model(root: Path) -> Path:
    """A randomly initialised tiny Llama with a locally trained tokenizer: enough for lm-eval to start."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["Q: What is the email of Ann?\nA: ann@example.com\n"] * 4, vocab_size=300)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return root


@pytest.mark.parametrize(
    ("which", "named"),
    [("data_duplicate_id", ["forget", "ID"]), ("data_missing_column", ["forget.jsonl", "answer"])],
    ids=["bad-data/lm-eval-duplicate-id", "bad-data/lm-eval-missing-column"],
)
def test_lm_eval_refuses_bad_data_in_one_line(which, named, inputs, tmp_path):
    model = inputs.root / "tiny_hf"
    if not model.exists():
        _tiny_hf_model(model)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets")}  # fmt: skip
    out = tmp_path / "lm_eval_out"
    result, _ = _script(
        str(BIN / "lm_eval"), "--model", "hf", "--model_args", f"pretrained={model}", "--tasks",
        "lacuna_email_forget_qa", "--limit", "1", "--device", "cpu", "--output_path", str(out),
        "--metadata", json.dumps({"lacuna_data": str(getattr(inputs, which))}), env=env,
    )  # fmt: skip
    if os.environ.get("SHOW_ERRORS"):
        print(f"\n@@ {which} [{result.returncode}]\n{result.stderr[-1500:]}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("lm_eval: error: ")], result.stderr
    for culprit in named:
        assert culprit in result.stderr, (culprit, result.stderr[-2000:])
    assert not out.exists() or not list(out.rglob("results*.json"))
