"""The bad-input suite, part 2: every CLI, every class of bad input (issue 17, item 6).

Each case asserts the exit code, no traceback, the culprit (file, key, tensor) named on stderr in one line, and
nothing half-written: no output file or directory, no ``.partial`` or ``.staging-*`` left behind, the inputs
untouched. Cases run in-process through :func:`lacuna_unlearn.bench.cli.main.main` (the code the ``lacuna`` script
runs) on real files: tiny safetensors checkpoints with a config, real mask files, real LACUNA data directories
(``CASES`` and the files: tests/helpers/bad_input_cases.py). Six also run through the console script in a subprocess
and two go through the real ``lm_eval`` command: tests/e2e/test_bad_input_console_scripts.py.
``SHOW_ERRORS=1 pytest -s -k refused`` prints every message with its time.

``CASES`` (107, ids ``class/command-what``): missing path 21, unwritable output 14, malformed JSON/YAML 9, unknown
key 15, bad value 28, mismatched checkpoints 4, bad masks 7, bad tensors 5, bad data 4 (+2 through ``lm_eval``).
By command: score 36 (bad masks and tensors included), attack 23, gate 11, diagnose 8, reversibility 8, build-testbed 8, run 13.
``tests/e2e/test_bad_input.py`` holds 18 more (``lacuna-unlearn`` 10, ``lacuna run`` 8), as subprocesses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
from helpers.bad_input_cases import (
    CASES,
    Inputs,
    _left_behind,
    _score,
    build_inputs,
)

from lacuna_metrics.masks import save_masks
from lacuna_unlearn.bench.cli.main import main


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Inputs:
    return build_inputs(tmp_path_factory.mktemp("bad_input"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_is_refused(case_id, inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LACUNA_CACHE", str(tmp_path / "cache"))  # never ~/.cache
    case = CASES[case_id]
    out = tmp_path / "out"
    if case_id == "malformed-yaml/run-config":
        inputs.bad_json.with_suffix(".yaml").write_text("attack: [unclosed\n")
    before = {p: p.stat().st_mtime_ns for p in inputs.root.rglob("*")}
    started = time.perf_counter()
    code, stdout, err = _run(case.argv(inputs, out), capsys)
    elapsed = time.perf_counter() - started
    if os.environ.get("SHOW_ERRORS"):
        print(f"\n@@ {case_id} [{elapsed:.2f}s] code={code}\n{err.strip()}")
    assert code == case.code, (code, err[-2000:], stdout[-2000:])
    assert "Traceback" not in err, err[-3000:]
    assert err.strip(), "no message on stderr"
    for culprit in case.named(inputs, out):
        assert culprit in err, (culprit, err[-2000:])
    lines = err.strip().splitlines()
    if case_id == "malformed-yaml/run-config":  # lacuna run's YAML error quotes the line (lacuna_unlearn/bench/run.py)
        lines = lines[:1]
    assert len(lines) == 1 and "error" in lines[0] and len(lines[0]) < 1200, err[-3000:]  # one line
    assert not _left_behind(out), _left_behind(out)
    changed = [p for p, m in before.items() if p.exists() and p.stat().st_mtime_ns != m]
    assert not changed, changed  # inputs untouched (no stamp, no rewrite)
    assert elapsed < 30, elapsed  # refused before any real work (generous: the machine is shared)


def test_suite_size():
    """Issue 17 asks for at least 60 cases over every CLI; this file holds most of them."""
    classes: dict[str, int] = {}
    for case_id in CASES:
        classes[case_id.split("/")[0]] = classes.get(case_id.split("/")[0], 0) + 1
    assert sum(classes.values()) >= 60, classes
    assert len(classes) >= 9, classes


# -- the accepted counterparts: what score.json records about the masks' model ------------------------------------


@pytest.mark.parametrize(
    ("masks", "extra", "status", "warned"),
    [
        ("masks", [], "verified", False),
        ("masks_unstamped", [], "unverified", True),
        ("masks_other_model", ["--allow-mask-mismatch"], "mismatch_allowed", True),
    ],
)
def test_score_records_whether_the_masks_belong_to_before(masks, extra, status, warned, inputs, tmp_path, capsys):
    path = getattr(inputs, masks, None)
    if path is None:  # the same masks, saved without a model fingerprint (a user's own file)
        from lacuna_metrics.masks import load_masks

        unstamped = dataclasses.replace(load_masks(inputs.masks), model_fingerprint=None)
        path = save_masks(unstamped, tmp_path / "unstamped.safetensors")
        path_fp = None
    else:
        from lacuna_metrics.masks import MaskReader

        path_fp = MaskReader(path).model_fingerprint
    out = tmp_path / "score"
    code, _, err = _run(_score(inputs, out, *extra, masks=path), capsys)
    assert code == 0, err[-2000:]
    record = json.loads((out / "score.json").read_text())["manifest"]["masks_model"]
    assert record == {"fingerprint": path_fp, "status": status}
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert (len(warnings) == 1 and str(path) in warnings[0]) if warned else not warnings, err


# -- lm-eval: a metric nothing observed, and the paraphrased splits ------------------------------------------------


def test_a_per_person_metric_without_observation_is_null_not_nan(inputs, tmp_path, capsys):
    """``--limit 4`` on the worst-case task runs plain probes only: j_icr has no observation. It is None (JSON
    null), which ``lacuna gate`` reports as MISSING, not NaN (which is not JSON and poisons every mean)."""
    from lacuna_tasks.harness.hooks import per_person_any, process_generation

    docs = [{"kind": "worstcase", "side": "forget", "setting": "plain", "person": "p0", "answer": "a@b.c",
             "field": "email"}] * 4  # fmt: skip
    per_doc = [process_generation(d, ["nothing"]) for d in docs]
    assert per_person_any(r["j_icr"] for r in per_doc) is None
    assert per_person_any(r["j_p"] for r in per_doc) == 0.0
    results = tmp_path / "results.json"
    doc = json.loads(inputs.lm_eval.read_text())
    doc["results"]["lacuna_email_forget_worstcase"] = {"j_w,none": 0.0, "j_icr,none": None}
    results.write_text(json.dumps(doc))
    code, out, err = _run(["gate", str(results), "--check", "j_icr<=0.5", "--max-jw", "0.5"], capsys)
    assert code == 1 and "MISSING" in out and "Traceback" not in err, (out, err)


def test_paraphrased_splits_are_read_as_their_side(inputs):
    from lacuna_tasks.harness.hooks import build_docs
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.schema import LacunaDataError

    data = load_data(inputs.data)
    for side in ("forget", "retain"):
        docs = build_docs(data, field="email", side=f"{side}_paraphrased", kind="memorization")
        rows = data.rows(f"{side}_paraphrased", "email")
        assert sorted(d["question"] for d in docs) == sorted(r["question"] for r in rows)
        assert {d["side"] for d in docs} == {side} and {d["split"] for d in docs} == {f"{side}_paraphrased"}
        main_questions = {r["question"] for r in data.rows(side, "email")}
        assert not main_questions & {d["question"] for d in docs}  # another prompt for the same fact
    qa = build_docs(data, field="email", side="forget_paraphrased", kind="qa")
    assert {d["side"] for d in qa} == {"forget"}
    with pytest.raises(LacunaDataError, match="forget_paraphrased.*qa or memorization"):
        build_docs(data, field="email", side="forget_paraphrased", kind="worstcase")
