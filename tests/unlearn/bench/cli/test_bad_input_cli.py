"""The bad-input suite, part 2: every CLI, every class of bad input (issue 17, item 6).

Each case asserts the exit code, no traceback, the culprit (file, key, tensor) named on stderr in one line, and
nothing half-written: no output file or directory, no ``.partial`` or ``.staging-*`` left behind, the inputs
untouched. Cases run in-process through :func:`lacuna_unlearn.bench.cli.main.main` (the code the ``lacuna`` script
runs) on real files: tiny safetensors checkpoints with a config, real mask files, real LACUNA data directories
(``CASES`` and the files: tests/helpers/bad_input_cases.py). Six also run through the console script in a subprocess
and two go through the real ``lm_eval`` command: tests/e2e/test_bad_input_console_scripts.py.
``SHOW_ERRORS=1 pytest -s -k refused`` prints every message with its time.

``CASES`` (166, ids ``class/command-what``): missing path 21, unwritable output 15, malformed JSON/YAML 9, unknown
key 15, bad value 28, mismatched checkpoints 4, bad masks 9, bad tensors 5, bad data 11 (issue 36: LACUNA's released data
directory broken four ways in 5 cases, a directory in neither layout, a release's group beyond its mask's bits; its
unmasked regime and a mask.pt of another model under bad masks; +2 through ``lm_eval``),
faults 34 (issue 37 item 6: a full disk 7, data that is not UTF-8 10, unreadable data 4, a path through a symlink
loop 13; a full disk is simulated by :func:`~helpers.bad_input_cases.full_disk`, a denied read as root by
``deny_reads``), a flag and ``--set`` with different values 15 (issue 37 item 5: ``precedence/*``).
By command: score 45 (bad masks and tensors included), attack 43, gate 15, diagnose 13, reversibility 11,
build-testbed 11, run 20, demo 6, data generate 2. Below them: the accepted counterparts (a flag and ``--set``
agreeing, ``--set`` alone filling a flag) and the lm-eval tasks on unreadable data (2).
``tests/e2e/test_bad_input.py`` holds 18 more (``lacuna-unlearn`` 10, ``lacuna run`` 8), as subprocesses;
``tests/e2e/test_faults_ulimit.py`` 8 (a real ``ulimit -f`` on score, data generate, reversibility and safetensors;
``lacuna-unlearn`` on symlink loops and unreadable or non-UTF-8 data).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
from helpers.bad_input_cases import (
    BIN,
    CASES,
    Inputs,
    _left_behind,
    _score,
    build_inputs,
    deny_reads,
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
    with monkeypatch.context() as fault:  # a full disk, a denied read: only while the command runs
        if case.setup is not None:
            case.setup(inputs, out, fault)
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


# -- a flag and --set of one setting: the accepted counterparts of ``precedence/*`` -------------------------------


_REPORT = {"persons": 1, "judge": "lacuna", "success_at_n_unlearned": 0.0, "success_at_n_relearned": 0.0,
           "leak_rate_unlearned": 0.0, "leak_rate_relearned": 0.0, "forgotten": [], "resurfaced": [],
           "pct_resurfaced_of_forgotten": 0.0}  # fmt: skip


@pytest.fixture
def backends(monkeypatch) -> dict:
    """The work behind run, demo, attack and build-testbed replaced by a recorder of what it was given."""
    import lacuna_unlearn.bench.attacks as attacks
    import lacuna_unlearn.bench.report.markdown as markdown
    import lacuna_unlearn.bench.run as run
    import lacuna_unlearn.testbed.build as build

    seen: dict = {}
    monkeypatch.setattr(run, "run_benchmark", lambda out, cfg, log=None, lacuna_root=None: seen.update(run=cfg) or {})
    monkeypatch.setattr(markdown, "run_markdown", lambda results: "")
    monkeypatch.setattr(
        attacks, "resurfacing_attack", lambda model, out, **kw: seen.update(attack=(out, kw)) or _REPORT
    )
    monkeypatch.setattr(build, "build_testbed", lambda out, **kw: seen.update(testbed=kw) or out)
    return seen


def test_a_flag_and_set_with_one_value_are_accepted(inputs, tmp_path, capsys, backends):
    out = str(tmp_path / "o")
    assert _run(["run", "--seeds", "1,2", "--set", "seeds=[1,2]", "--out", out], capsys)[0] == 0
    assert backends["run"]["seeds"] == [1, 2]
    demo = ["demo", "--field", "email", "--set", "fields=[email]", "--testbed", str(inputs.fake_testbed)]
    assert _run([*demo, "--set", f"testbed={inputs.fake_testbed}/", "--out", out], capsys)[0] == 0
    assert backends["run"]["fields"] == ["email"] and backends["run"]["testbed"] == str(inputs.fake_testbed)
    assert _run(["build-testbed", "--seed", "3", "--set", "seed=3", "--out", out], capsys)[0] == 0
    assert backends["testbed"]["seed"] == 3 and backends["testbed"]["overrides"] == {"seed": 3}
    attack = ["attack", "--model", str(inputs.before), "--data", str(inputs.data), "--out", out]
    code, _, err = _run([*attack, "--seed", "7", "--set", "seed=7", "--budget", "10", "--set", "budget=10"], capsys)
    assert code == 0, err
    _, kw = backends["attack"]
    assert kw["seed"] == 7 and kw["overrides"] == ["budget=10"]


def test_a_setting_given_by_set_alone_is_the_flag(inputs, tmp_path, capsys, backends):
    """``lacuna attack --set seed=3`` is ``--seed 3``: the probe, the output name and attack.json read it too."""
    argv = ["attack", "--model", str(inputs.before), "--data", str(inputs.data), "--set", "seed=3"]
    code, _, err = _run(
        [*argv, "--set", "attack=relearn_lora", "--set", "field=phone", "--set", "+eval_steps=5"], capsys
    )
    assert code == 0, err
    out, kw = backends["attack"]
    assert (kw["seed"], kw["protocol"], kw["field"]) == (3, "relearn_lora", "phone")
    assert kw["overrides"] == ["+eval_steps=5"] and out == inputs.before.with_name("before_attack_relearn_lora")
    code, _, err = _run(["attack", "--model", str(inputs.before), "--data", str(inputs.data)], capsys)
    assert code == 0, err
    assert (backends["attack"][1]["seed"], backends["attack"][1]["protocol"]) == (42, "relearn")  # the defaults


# -- the lm-eval tasks on data that cannot be read (the real lm_eval command: test_bad_input_console_scripts.py) ---


@pytest.mark.parametrize(
    ("which", "named"),
    [("data_not_utf8", ["forget.jsonl:3", "not UTF-8", "byte offset"]), ("data_unreadable", ["permission denied"])],
    ids=["fault/lm-eval-data-not-utf8", "fault/lm-eval-data-unreadable"],
)
def test_lm_eval_tasks_refuse_unreadable_data_in_one_line(which, named, inputs, monkeypatch, capsys):
    """What ``lm_eval --tasks lacuna_email_forget_qa`` runs with ``LACUNA_DATA`` set: the task's ``custom_dataset``."""
    import sys

    from lacuna_tasks.harness.hooks import load_docs

    data = getattr(inputs, which)
    monkeypatch.setenv("LACUNA_DATA", str(data))
    monkeypatch.setattr(sys, "argv", [str(BIN / "lm_eval"), "--tasks", "lacuna_email_forget_qa"])
    if which == "data_unreadable":
        deny_reads(monkeypatch, data / "forget.jsonl")
    with pytest.raises(SystemExit) as exit_:
        load_docs(field="email", side="forget", kind="qa")
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"lm_eval: error: {data / 'forget.jsonl'}"), err
    for culprit in named:
        assert culprit in err, (culprit, err)
