"""One home for results facts (lacuna_unlearn.bench.metric_table, lacuna_metrics.schemas): the metric table the gate derives its keys from, the schema
stamps, and the one lm-eval results reader (lacuna_tasks.harness.results) with its two rules (newest run of one
model; the ``none`` filter, else a metric's only filter) seen through each consumer: ``lacuna gate``,
``accuracies_from_lm_eval`` (``lacuna reversibility``) and ``lacuna_tasks.harness.evaluate``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from lacuna_metrics.behaviour.regimes import accuracies_from_lm_eval
from lacuna_metrics.schemas import SCHEMAS, read_schema, schema_stamp
from lacuna_tasks.harness.results import (
    LmEvalResultsError,
    find_lm_eval_results,
    metric_value,
    read_lm_eval_results,
    resolve_lm_eval_results,
    task_metrics,
)
from lacuna_unlearn.bench.gate import command as gate
from lacuna_unlearn.bench.gate import subjects as gate_subjects
from lacuna_unlearn.bench.metric_table import METRIC_TABLE, lm_eval_metrics, run_metric_paths, score_metric_paths

FORGET, RETAIN = "lacuna_email_forget_qa", "lacuna_email_retain_qa"


def lm_eval_doc(leak: float = 0.1, retain: float = 0.9, *, forget_keys: dict | None = None) -> dict:
    tasks = {
        FORGET: forget_keys if forget_keys is not None else {"leak_rate,none": leak, "leak_rate_stderr,none": 0.01},
        RETAIN: {"accuracy,none": retain},
    }
    return {
        "results": tasks,
        "configs": {t: {"task": t} for t in tasks},
        "config": {"model": "hf", "model_args": "pretrained=/ckpts/unlearned"},
        "model_name": "/ckpts/unlearned",
    }


def write(path: Path, doc: dict | str, *, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def run_gate(*argv: object) -> int:
    p = argparse.ArgumentParser()
    gate.add_arguments(p)
    return gate.run(p.parse_args([str(a) for a in argv]))


# ------------------------------------------------------------------------------------------- the metric table


def test_every_metric_table_key_is_a_gate_metric():
    assert list(gate.METRICS) == list(METRIC_TABLE)
    assert all(gate.METRICS[k] == spec.description for k, spec in METRIC_TABLE.items())
    # the gate's lookup tables are the table's, not copies that can drift
    assert gate_subjects._LM_EVAL_METRICS == lm_eval_metrics()
    assert gate_subjects._RUN_METRICS == run_metric_paths()
    assert gate_subjects._SCORE_METRICS == score_metric_paths()
    for _, _, key, _, _ in gate._BUILTINS:
        assert key in METRIC_TABLE


def test_new_table_metrics_are_read_from_lm_eval_and_run_results(tmp_path):
    doc = lm_eval_doc()
    doc["results"]["lacuna_email_retain_paraphrase"] = {"j_avg,none": 0.7}
    doc["results"]["lacuna_email_retain_eval_crossfield_qa"] = {"accuracy,none": 0.6}
    doc["configs"] = {t: {} for t in doc["results"]}
    out = write(tmp_path / "out" / "m" / "results_2026-01-01T00-00-00.json", doc)
    [subject] = gate.load_subjects(out)
    assert subject.metrics["retain_j_avg"] == 0.7 and subject.metrics["retain_eval_crossfield_accuracy"] == 0.6
    assert run_gate(out, "--check", "retain_j_avg>=0.7", "--check", "retain_eval_crossfield_accuracy>=0.6") == 0


# ------------------------------------------------------------------------------------------------- schemas


def test_schema_stamp_and_both_shapes_are_read():
    assert schema_stamp("gate") == {"name": "lacuna-bench/gate", "version": 1}
    with pytest.raises(KeyError, match="unknown artifact kind"):
        schema_stamp("nope")
    assert read_schema({"schema": {"name": "lacuna-bench/run", "version": 1}}) == ("lacuna-bench/run", 1)
    assert read_schema({"schema": "lacuna-bench/score", "schema_version": 2}) == ("lacuna-bench/score", 2)
    assert read_schema({"results": {}}) == (None, None)
    # the gate tells kinds apart by the schema name in either shape
    assert gate_subjects._kind({"schema": {"name": SCHEMAS["run"][0], "version": 1}}) == "run"
    assert gate_subjects._kind({"schema": SCHEMAS["score"][0], "schema_version": 2}) == "score"
    assert gate_subjects._kind({"schema": {"name": SCHEMAS["score"][0], "version": 2}}) == "score"
    assert gate_subjects._kind(lm_eval_doc()) == "lm-eval"


def test_gate_json_is_stamped_from_the_schema_table(tmp_path):
    out = write(tmp_path / "out" / "m" / "results_2026-01-01T00-00-00.json", lm_eval_doc())
    report = tmp_path / "gate.json"
    assert run_gate(out, "--max-leak", "0.5", "--json", report) == 0
    assert json.loads(report.read_text())["schema"] == schema_stamp("gate")


# ------------------------------------------------------------------------------------- the reader's rules


def test_newest_run_of_one_model_by_the_timestamp_in_the_name(tmp_path):
    model = tmp_path / "out" / "__ckpts__unlearned"
    newer = write(model / "results_2026-02-01T00-00-00.000001.json", lm_eval_doc(leak=0.0), mtime=1_000)
    write(model / "results_2026-01-01T00-00-00.000001.json", lm_eval_doc(leak=0.5), mtime=2_000)
    write(model / "samples_lacuna_email_forget_qa_2026-03-01T00-00-00.jsonl", "{}\n")
    assert find_lm_eval_results(tmp_path / "out") == newer  # the name's timestamp, not the file's mtime
    assert find_lm_eval_results(model) == newer
    assert resolve_lm_eval_results(newer) == newer


def test_several_models_in_one_directory_are_refused(tmp_path):
    write(tmp_path / "out" / "a" / "results_2026-01-01T00-00-00.json", lm_eval_doc())
    write(tmp_path / "out" / "b" / "results_2026-02-01T00-00-00.json", lm_eval_doc())
    with pytest.raises(LmEvalResultsError, match="2 models") as info:
        find_lm_eval_results(tmp_path / "out")
    assert str(tmp_path / "out" / "a") in str(info.value) and str(tmp_path / "out" / "b") in str(info.value)
    assert find_lm_eval_results(tmp_path / "out" / "b").parent.name == "b"


def test_output_path_json_means_its_stamped_files(tmp_path):
    write(tmp_path / "x_2026-01-01T00-00-00.json", lm_eval_doc())
    newest = write(tmp_path / "x_2026-01-02T00-00-00.json", lm_eval_doc())
    assert resolve_lm_eval_results(tmp_path / "x.json") == newest
    with pytest.raises(FileNotFoundError, match="y.json"):
        resolve_lm_eval_results(tmp_path / "y.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="results_"):
        resolve_lm_eval_results(tmp_path / "empty")


def test_filters():
    assert metric_value({"acc,none": 0.5, "acc,strict": 0.1}, "acc") == 0.5
    assert metric_value({"acc,strict": 0.1}, "acc") == 0.1
    assert metric_value({"acc,strict": 0.1, "acc,flexible": 0.2}, "acc") is None  # ambiguous
    assert metric_value({"acc,strict": 0.1, "acc,flexible": 0.2}, "acc", "flexible") == 0.2
    assert metric_value({"acc_stderr,none": 0.1}, "acc") is None
    assert metric_value(None, "acc") is None
    entry = {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1, "em,strict": 0.3, "f1,a": 1.0, "f1,b": 0.0}
    assert task_metrics(entry) == {"acc": 0.5, "em": 0.3}


def test_malformed_results_name_the_file(tmp_path):
    bad = write(tmp_path / "m" / "results_2026-01-01T00-00-00.json", "{not json")
    with pytest.raises(LmEvalResultsError, match="malformed JSON") as info:
        read_lm_eval_results(tmp_path / "m")
    assert str(bad) in str(info.value)
    other = write(tmp_path / "other.json", {"config": {}})
    with pytest.raises(LmEvalResultsError, match="no 'results' object"):
        read_lm_eval_results(other)


# -------------------------------------------------------------------------------------- through the gate


def test_gate_reads_the_newest_run_and_refuses_two_models(tmp_path, capsys):
    model = tmp_path / "out" / "__ckpts__unlearned"
    write(model / "results_2026-01-01T00-00-00.json", lm_eval_doc(leak=0.5), mtime=2_000)
    write(model / "results_2026-02-01T00-00-00.json", lm_eval_doc(leak=0.0), mtime=1_000)
    assert run_gate(tmp_path / "out", "--max-leak", "0.1") == 0
    assert "results_2026-02-01T00-00-00.json" in capsys.readouterr().out
    write(tmp_path / "out" / "other" / "results_2026-03-01T00-00-00.json", lm_eval_doc(leak=0.5))
    assert run_gate(tmp_path / "out", "--max-leak", "0.1") == 2
    err = capsys.readouterr().err
    assert err.startswith("lacuna gate: error: ") and "2 models" in err and str(tmp_path / "out") in err
    assert run_gate(model, "--max-leak", "0.1") == 0


def test_gate_reads_filtered_metric_keys(tmp_path):
    only = lm_eval_doc(forget_keys={"leak_rate,strict": 0.05})
    assert run_gate(write(tmp_path / "a" / "results_1.json", only), "--max-leak", "0.1") == 0
    both = lm_eval_doc(forget_keys={"leak_rate,none": 0.05, "leak_rate,strict": 0.9})
    assert run_gate(write(tmp_path / "b" / "results_1.json", both), "--max-leak", "0.1") == 0
    ambiguous = lm_eval_doc(forget_keys={"leak_rate,strict": 0.05, "leak_rate,loose": 0.05})
    path = write(tmp_path / "c" / "results_1.json", ambiguous)
    assert run_gate(path, "--max-leak", "0.1") == 1  # not measured: MISSING
    assert run_gate(path, "--max-leak", "0.1", "--allow-missing") == 0


def test_gate_names_a_malformed_lm_eval_file(tmp_path, capsys):
    bad = write(tmp_path / "out" / "m" / "results_2026-01-01T00-00-00.json", "{not json")
    assert run_gate(tmp_path / "out", "--max-leak", "0.1") == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "malformed JSON" in err


# ---------------------------------------------------------------------------- through lacuna reversibility


def test_reversibility_reads_the_newest_run_and_filtered_keys(tmp_path):
    model = tmp_path / "out" / "m"
    write(model / "results_2026-01-01T00-00-00.json", lm_eval_doc(leak=0.5))
    write(model / "results_2026-02-01T00-00-00.json", lm_eval_doc(leak=0.25))
    assert accuracies_from_lm_eval(tmp_path / "out", FORGET, RETAIN) == (0.25, 0.9)
    only = write(tmp_path / "f.json", lm_eval_doc(forget_keys={"leak_rate,strict": 0.125}))
    assert accuracies_from_lm_eval(only, FORGET, RETAIN) == (0.125, 0.9)
    ambiguous = write(tmp_path / "g.json", lm_eval_doc(forget_keys={"leak_rate,a": 0.1, "leak_rate,b": 0.2}))
    with pytest.raises(ValueError, match="several filters"):
        accuracies_from_lm_eval(ambiguous, FORGET, RETAIN)


def test_reversibility_names_a_malformed_file(tmp_path):
    bad = write(tmp_path / "m" / "results_2026-01-01T00-00-00.json", "{not json")
    with pytest.raises(ValueError, match="malformed JSON") as info:
        accuracies_from_lm_eval(tmp_path / "m", FORGET, RETAIN)
    assert str(bad) in str(info.value)


# --------------------------------------------------------------------------------- through evaluate()


def test_evaluate_strips_filters_by_the_same_rule(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    import lacuna_tasks.harness.register as register
    from lacuna_tasks.harness.evaluate import evaluate

    entry = {"alias": "t", "leak_rate,none": 0.5, "leak_rate,strict": 0.9, "leak_rate_stderr,none": 0.1}
    entry |= {"accuracy,strict": 0.25, "j_w,a": 1.0, "j_w,b": 0.0}
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kwargs: {"results": {FORGET: entry}, "samples": {}})
    monkeypatch.setattr(register, "task_manager", lambda meta: None)
    (tmp_path / "config.json").write_text("{}")
    out = evaluate(tmp_path, [FORGET])
    assert out["results"][FORGET] == {"leak_rate": 0.5, "accuracy": 0.25}
    assert out["results"][FORGET] == task_metrics(entry)
