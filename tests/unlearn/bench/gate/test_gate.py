"""``lacuna gate``: criteria, input kinds, exit codes, JUnit/JSON reports and the CI docs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import REPO
from helpers.gate_cli import gate

from lacuna_unlearn.bench.gate.command import (
    FAIL,
    MISSING,
    PASS,
    Criterion,
    GateError,
    evaluate,
    find_lm_eval_results,
    load_subjects,
    parse_check,
    write_junit,
)


def method(
    leak: float, retain: float, auc: float, *, success: float = 0.1, frag: float = 0.3, calibrated: float | None = None
) -> dict:
    """A results.json method entry; ``calibrated`` is the null-calibrated best AUC(F) (default: ``auc``)."""
    cal = auc if calibrated is None else calibrated
    return {
        "behaviour": {"forget_leak": leak, "retain_accuracy": retain, "j_w": leak + 0.05, "j_p": leak, "j_icr": 0.0},
        "auc": {
            "forget": {
                "best": {"score": "qtile", "value": auc},
                "raw": auc - 0.1,
                "calibrated_best": {"score": "raw", "value": cal},
            },
            "unified": {
                "best": {"score": "abs", "value": auc - 0.05},
                "calibrated_best": {"score": "abs", "value": cal - 0.05},
            },
            "forget_vs_retain": {"best": {"score": "abs", "value": 0.6}},
        },
        "frag": frag,
        "l2": 3.5,
        "attack": {
            "success_at_n_unlearned": 0.0,
            "success_at_n_relearned": success,
            "pct_resurfaced_of_forgotten": 0.5,
        },
        "regime": {"regime": "localized"},
    }


def run_results(tmp_path: Path, methods: dict | None = None) -> Path:
    doc = {
        "schema": {"name": "lacuna-bench/run", "version": 1},
        "preset": "mini",
        "field": "email",
        "baseline": {
            "behaviour": {"forget_leak": 0.9, "retain_accuracy": 0.95},
            "auc": {"forget": {"before_magnitude": 0.5, "injection_magnitude": 1.0}},
        },
        "methods": methods
        if methods is not None
        else {"oracle_grad": method(0.05, 0.9, 0.92), "grad_diff": method(0.4, 0.7, 0.6, success=0.8)},
        "manifest": {"seed": 0},
    }
    path = tmp_path / "runs" / "mini" / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def lm_eval_results(field: str = "email", *, leak: float = 0.05, retain: float = 0.9, extraction: bool = True) -> dict:
    results = {
        f"lacuna_{field}": {" ": " ", "alias": f"lacuna_{field}"},
        f"lacuna_{field}_forget_qa": {"alias": " - forget_qa", "leak_rate,none": leak, "leak_rate_stderr,none": 0.01},
        f"lacuna_{field}_retain_qa": {"alias": " - retain_qa", "accuracy,none": retain, "accuracy_stderr,none": "N/A"},
        f"lacuna_{field}_forget_worstcase": {
            "j_w,none": 0.1,
            "j_p,none": 0.05,
            "j_icr,none": 0.0,
            "leak_rate,none": 0.1,
        },
    }
    if extraction:
        results[f"lacuna_{field}_extraction"] = {"success_at_n,none": 0.2, "leak_rate,none": 0.01}
    return {
        "results": results,
        "groups": {f"lacuna_{field}": {" ": " "}},
        "configs": {task: {"task": task} for task in results},
        "versions": {task: 1.0 for task in results},
        "config": {"model": "hf", "model_args": "pretrained=/ckpts/unlearned,dtype=float32"},
        "model_name": "/ckpts/unlearned",
        "model_name_sanitized": "__ckpts__unlearned",
    }


def lm_eval_dir(tmp_path: Path, doc: dict | None = None, stamp: str = "2026-01-01T00-00-00.000001") -> Path:
    out = tmp_path / "out"
    path = out / "__ckpts__unlearned" / f"results_{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc if doc is not None else lm_eval_results()))
    (path.parent / f"samples_lacuna_email_forget_qa_{stamp}.jsonl").write_text("{}\n")
    return out


def score_json(tmp_path: Path, auc: float = 0.85, frag: float | None = 0.25) -> Path:
    doc = {
        "schema": "lacuna-bench/score",
        "schema_version": 1,
        "auc": {
            t: {"qtile": auc, "abs": auc - 0.1, "best": {"score": "qtile", "value": auc}}
            for t in ("forget", "unified", "forget_vs_retain")
        },
        "null_calibration": {
            "targets": {
                t: {"best": {"score": "qtile", "value": auc}, "best_lift": {"score": "qtile", "value": auc - 0.5}}
                for t in ("forget", "unified", "forget_vs_retain")
            }
        },
        "frag": {"forget_alignment": 0.5, "retain_alignment": 0.2, "gamma": 1.0, "frag": frag}
        if frag is not None
        else {"skipped": "no calibration text"},
        "distance": {"l2": 2.0},
        "manifest": {"inputs": {"before": {"path": "/ckpts/before"}, "after": {"path": "/ckpts/unlearned"}}},
    }
    path = tmp_path / "score" / "score.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


# ------------------------------------------------------------------------------------------- exit codes


def test_run_results_all_pass(tmp_path, capsys):
    path = run_results(tmp_path)
    assert gate(path, "--method", "oracle_grad", "--max-leak", "0.1", "--min-retain", "0.8", "--min-auc", "0.85") == 0
    out = capsys.readouterr().out
    assert "oracle_grad" in out and "grad_diff" not in out
    assert [line.split()[-1] for line in out.splitlines() if "oracle_grad" in line] == ["PASS"] * 3


def test_two_methods_one_fails(tmp_path, capsys):
    path = run_results(tmp_path)
    json_out = tmp_path / "gate.json"
    assert gate(path, "--max-leak", "0.1", "--min-auc", "0.85", "--json", json_out) == 1
    report = json.loads(json_out.read_text())
    status = {(v["subject"], v["criterion"]): v["status"] for v in report["verdicts"]}
    assert status == {
        ("oracle_grad", "max-leak"): PASS,
        ("grad_diff", "max-leak"): FAIL,
        ("oracle_grad", "min-auc"): PASS,
        ("grad_diff", "min-auc"): FAIL,
    }
    assert report["passed"] is False and report["exit_code"] == 1
    assert report["counts"] == {"pass": 2, "fail": 2, "missing": 0}
    from lacuna_metrics.weights.checkpoints import file_fingerprint

    manifest = report["manifest"]  # what every artifact records: the judged bytes, versions, hardware
    assert manifest["input_fingerprints"] == {str(path): file_fingerprint(path)}
    assert "lacuna-bench" in manifest["versions"] and manifest["hardware"]["cpu_count"] >= 1


def test_directory_of_a_run_uses_its_results_json(tmp_path):
    path = run_results(tmp_path)
    assert gate(path.parent, "--method", "oracle_grad", "--max-success", "0.1") == 0
    assert gate(path.parent, "--method", "grad_diff", "--max-success", "0.5") == 1  # relearned Success@N 0.8


def test_exactly_at_threshold_passes(tmp_path):
    path = run_results(tmp_path, {"m": method(0.1, 0.8, 0.85, success=0.3, frag=0.3)})
    assert (
        gate(
            path,
            "--max-leak=0.1",
            "--min-retain=0.8",
            "--min-auc=0.85",
            "--max-success=0.3",
            "--max-frag=0.3",
            "--min-frag=0.3",
            "--check",
            "methods.m.l2>=3.5",
            "--check",
            "l2<=3.5",
        )
        == 0
    )


def test_check_dotted_paths(tmp_path, capsys):
    path = run_results(tmp_path)
    assert gate(path, "--check", "methods.oracle_grad.auc.forget.best.value>=0.85") == 0
    assert "oracle_grad" in capsys.readouterr().out
    assert gate(path, "--check", "methods.grad_diff.auc.forget.best.value>=0.85") == 1
    # relative to each method, wildcard, metric key, and an absolute non-method path
    assert gate(path, "--method", "oracle_grad", "--check", "auc.forget.raw >= 0.8") == 0
    assert gate(path, "--check", "methods.*.auc.forget.raw>=0.8") == 1
    assert gate(path, "--check", "j_p<=0.5") == 0
    assert gate(path, "--check", "baseline.behaviour.forget_leak>=0.5") == 0
    assert "baseline" in capsys.readouterr().out


def test_evaluate_subjects_for_path_forms(tmp_path):
    subjects = load_subjects(run_results(tmp_path))
    verdicts = evaluate(
        subjects,
        [
            parse_check("methods.*.l2<=4"),
            parse_check("methods.oracle_grad.frag<=1"),
            parse_check("behaviour.forget_leak<=1"),
            parse_check("preset>=0"),
        ],
    )
    assert [(v.criterion.metric, v.subject) for v in verdicts] == [
        ("methods.*.l2", "oracle_grad"),
        ("methods.*.l2", "grad_diff"),
        ("methods.oracle_grad.frag", "oracle_grad"),
        ("behaviour.forget_leak", "oracle_grad"),
        ("behaviour.forget_leak", "grad_diff"),
        ("preset", "run"),
    ]
    assert [v.status for v in verdicts] == [PASS, PASS, PASS, PASS, PASS, FAIL]  # "mini" is not a number


# ------------------------------------------------------------------------------------- missing and NaN


def test_missing_metric_fails_unless_allowed(tmp_path, capsys):
    entry = method(0.05, 0.9, 0.9)
    del entry["attack"]
    entry["frag"] = None
    path = run_results(tmp_path, {"m": entry})
    assert gate(path, "--max-leak", "0.1", "--max-success", "0.5") == 1
    out = capsys.readouterr().out
    assert "MISSING" in out
    assert gate(path, "--max-leak", "0.1", "--max-success", "0.5", "--max-frag", "1", "--allow-missing") == 0
    assert "MISSING (allowed)" in capsys.readouterr().out
    # a failing criterion still fails with --allow-missing
    assert gate(path, "--max-leak", "0.01", "--max-success", "0.5", "--allow-missing") == 1


def test_missing_check_path(tmp_path):
    path = run_results(tmp_path)
    assert gate(path, "--check", "methods.rmu.l2<=10") == 1
    assert gate(path, "--check", "methods.rmu.l2<=10", "--allow-missing") == 0


def test_nan_fails(tmp_path):
    path = run_results(tmp_path, {"m": method(float("nan"), 0.9, 0.9)})
    assert "NaN" in path.read_text()  # json.dumps writes the NaN literal, as some tools do
    assert gate(path, "--max-leak", "0.1") == 1
    assert gate(path, "--max-leak", "0.1", "--allow-missing") == 1
    assert gate(path, "--min-retain", "0.8") == 0
    [verdict] = evaluate(load_subjects(path), [Criterion("max-leak", "forget_leak", "<=", 1.0)])
    assert verdict.status == FAIL and "NaN" in verdict.message


def test_nan_value_in_json_report_and_junit(tmp_path):
    path = run_results(tmp_path, {"m": method(float("nan"), 0.9, 0.9)})
    assert gate(path, "--max-leak", "0.1", "--json", tmp_path / "g.json", "--junit", tmp_path / "g.xml") == 1
    report = json.loads((tmp_path / "g.json").read_text())
    assert report["verdicts"][0]["value"] is None and report["verdicts"][0]["value_text"] == "nan"
    assert ET.parse(tmp_path / "g.xml").getroot().get("failures") == "1"


def test_non_number_fails():
    from lacuna_unlearn.bench.gate.command import Document, Subject

    subject = Subject("s", Document(Path("x.json"), "run", {}), {"forget_leak": "0.1"})
    [verdict] = evaluate([subject], [Criterion("max-leak", "forget_leak", "<=", 1.0)])
    assert verdict.status == FAIL and "not a number" in verdict.message


# ----------------------------------------------------------------------------------------- bad input


def test_malformed_json(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text('{"schema": ')
    assert gate(bad, "--max-leak", "0.1") == 2
    err = capsys.readouterr().err
    assert err.startswith("lacuna gate: error: ") and str(bad) in err and "malformed JSON" in err


def test_missing_file(tmp_path, capsys):
    assert gate(tmp_path / "nope.json", "--max-leak", "0.1") == 2
    assert "nope.json" in capsys.readouterr().err


def test_unrecognised_json(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert gate(other, "--max-leak", "0.1") == 2
    assert "other.json" in capsys.readouterr().err


@pytest.mark.parametrize("check", ["auc<0.5", "auc==0.5", "auc<=", "<=0.5", "auc<=abc", "auc<=nan", "a..b<=1"])
def test_bad_check(tmp_path, capsys, check):
    assert gate(run_results(tmp_path), "--check", check) == 2
    assert "bad --check" in capsys.readouterr().err
    with pytest.raises(GateError):
        parse_check(check)


def test_unknown_method(tmp_path, capsys):
    assert gate(run_results(tmp_path), "--method", "nonesuch", "--max-leak", "0.1") == 2
    err = capsys.readouterr().err
    assert "nonesuch" in err and "oracle_grad" in err


def test_no_criteria(tmp_path, capsys):
    assert gate(run_results(tmp_path)) == 2
    assert "no criteria" in capsys.readouterr().err


def test_bad_threshold_is_an_argparse_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        gate(run_results(tmp_path), "--max-leak", "nan")
    assert exc.value.code == 2


def test_field_mismatch_and_misplaced_options(tmp_path):
    path = run_results(tmp_path)
    assert gate(path, "--field", "phone", "--max-leak", "0.1") == 2
    assert gate(path, "--score", score_json(tmp_path), "--max-leak", "0.1") == 2
    assert gate(lm_eval_dir(tmp_path), "--method", "oracle_grad", "--max-leak", "0.1") == 2


def test_method_not_an_object(tmp_path, capsys):
    assert gate(run_results(tmp_path, {"m": [1, 2]}), "--max-leak", "0.1") == 2
    assert "methods.m" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ lm-eval input


def test_lm_eval_dir_with_score(tmp_path, capsys):
    out = lm_eval_dir(tmp_path)
    score = score_json(tmp_path, auc=0.85)
    # a schema-1 score.json of a checkpoint that is not here: unverifiable, gated only on request
    # (the pairing rules themselves: tests/e2e/test_gate_checkpoints_cli.py)
    args = ["--max-leak", "0.1", "--min-retain", "0.8", "--max-jw", "0.1", "--max-success", "0.2", "--allow-unverified"]
    assert gate(out, "--score", score, *args, "--min-auc", "0.85", "--max-frag", "0.25") == 0
    captured = capsys.readouterr()
    assert "/ckpts/unlearned" in captured.out and "results_2026-01-01T00-00-00.000001.json" in captured.out
    assert "UNVERIFIED" in captured.out and "warning: unverified checkpoint" in captured.err
    assert gate(out, "--score", score, "--min-auc", "0.9", "--allow-unverified") == 1
    assert gate(out, "--score", score, "--check", "score.auc.forget.qtile>=0.8", "--allow-unverified") == 0
    assert gate(out, "--score", score, "--min-auc", "0.5") == 2  # refused without --allow-unverified
    assert gate(out, "--check", "results.lacuna_email_forget_qa.leak_rate,none<=0.05") == 0
    # AUC without --score is not measured
    assert gate(out, "--min-auc", "0.5") == 1
    assert gate(out, "--min-auc", "0.5", "--allow-missing") == 0


def test_lm_eval_newest_results_file(tmp_path):
    out = lm_eval_dir(tmp_path, lm_eval_results(leak=0.5), stamp="2026-01-01T00-00-00.000001")
    lm_eval_dir(tmp_path, lm_eval_results(leak=0.0), stamp="2026-02-01T00-00-00.000001")
    assert find_lm_eval_results(out).name == "results_2026-02-01T00-00-00.000001.json"
    assert gate(out, "--max-leak", "0.1") == 0


def test_lm_eval_json_file_and_missing_extraction(tmp_path):
    out = lm_eval_dir(tmp_path, lm_eval_results(extraction=False))
    path = find_lm_eval_results(out)
    assert gate(path, "--max-leak", "0.1") == 0
    assert gate(path, "--max-success", "0.5") == 1
    assert gate(path, "--max-success", "0.5", "--allow-missing") == 0


def test_lm_eval_field_inference(tmp_path, capsys):
    doc = lm_eval_results("email")
    doc["results"].update(lm_eval_results("drivers_license", leak=0.6)["results"])
    out = lm_eval_dir(tmp_path, doc)
    assert gate(out, "--max-leak", "0.1") == 2
    assert "--field" in capsys.readouterr().err
    assert gate(out, "--field", "email", "--max-leak", "0.1") == 0
    assert gate(out, "--field", "drivers_license", "--max-leak", "0.1") == 1
    assert gate(out, "--field", "phone", "--max-leak", "0.1") == 2


def test_empty_output_dir(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert gate(tmp_path / "out", "--max-leak", "0.1") == 2
    assert "results_" in capsys.readouterr().err


def test_score_json_alone_and_skipped_frag(tmp_path):
    score = score_json(tmp_path, frag=None)
    [subject] = load_subjects(score)
    assert subject.name == "/ckpts/unlearned"
    assert gate(score, "--min-auc", "0.8", "--min-auc-unified", "0.8") == 0
    assert gate(score, "--max-frag", "0.5") == 1  # FRAG skipped: MISSING


def test_mixed_inputs_with_one_score_each(tmp_path):
    out = lm_eval_dir(tmp_path)
    other = tmp_path / "other"
    second = lm_eval_dir(other, lm_eval_results(leak=0.0))
    good, bad = score_json(tmp_path / "a", auc=0.9), score_json(tmp_path / "b", auc=0.5)
    unverified = "--allow-unverified"  # fake checkpoints: see tests/e2e/test_gate_checkpoints_cli.py for the pairing
    assert gate(out, second, "--score", good, "--score", bad, "--min-auc", "0.8", unverified) == 1
    assert gate(out, second, "--score", good, "--min-auc", "0.8", unverified) == 0
    assert gate(out, second, "--score", good, "--score", bad, "--score", good, "--min-auc", "0.8", unverified) == 2
    assert gate(out, run_results(tmp_path), "--method", "oracle_grad", "--max-leak", "0.1") == 0


# -------------------------------------------------------------------------------------------------- JUnit


def test_junit_failure_count(tmp_path):
    path = run_results(tmp_path)
    junit = tmp_path / "reports" / "gate.xml"
    assert gate(path, "--max-leak", "0.1", "--min-retain", "0.8", "--max-success", "0.5", "--junit", junit) == 1
    root = ET.parse(junit).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 6 and suite.get("tests") == "6"
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 3 == int(suite.get("failures")) == int(root.get("failures"))
    assert {c.get("classname") for c in failed} == {"lacuna.gate.grad_diff"}
    assert all(c.find("failure").get("message") for c in failed)
    assert not list(junit.parent.glob(".*.tmp"))  # atomic write leaves no temp file


def test_junit_missing_allowed_is_skipped(tmp_path):
    from lacuna_unlearn.bench.gate.command import exit_code

    subjects = load_subjects(run_results(tmp_path, {"m": {"behaviour": {"forget_leak": 0.0}}}))
    verdicts = evaluate(subjects, [Criterion("max-leak", "forget_leak", "<=", 0.1), Criterion("x", "l2", "<=", 1.0)])
    assert [v.status for v in verdicts] == [PASS, MISSING]
    assert exit_code(verdicts) == 1 and exit_code(verdicts, allow_missing=True) == 0
    root = ET.parse(write_junit(tmp_path / "a.xml", verdicts, allow_missing=True)).getroot()
    assert root.get("failures") == "0" and root.find(".//skipped") is not None
    root = ET.parse(write_junit(tmp_path / "b.xml", verdicts)).getroot()
    assert root.get("failures") == "1"


def test_threshold_display_never_hides_a_difference(capsys, tmp_path):
    path = run_results(tmp_path, {"m": method(0.1000000001, 0.9, 0.9)})
    assert gate(path, "--max-leak", "0.1") == 1
    assert "0.1000000001" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- docs


def test_workflow_yaml_parses_and_gates():
    yaml = pytest.importorskip("yaml")
    text = (REPO / "docs" / "lacuna-gate.yml").read_text()
    workflow = yaml.safe_load(text)
    assert isinstance(workflow, dict) and "jobs" in workflow
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "lacuna gate" in runs and "--junit" in runs and "lm_eval" in runs
    assert "download.pytorch.org/whl/cpu" in runs
    assert any(str(s.get("uses", "")).startswith("actions/upload-artifact") for s in steps)


def test_ci_doc_mentions_the_commands():
    text = (REPO / "docs" / "ci.md").read_text()
    for needle in ("lacuna gate out/", "--junit", "--method oracle_grad", "--allow-missing", "--check"):
        assert needle in text


def test_lm_eval_json_output_path_prefix(tmp_path):
    # lm_eval --output_path out/res.json writes out/res_<timestamp>.json
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "res_2026-01-01T00-00-00.json").write_text(json.dumps(lm_eval_results(leak=0.9)))
    (tmp_path / "out" / "res_2026-03-01T00-00-00.json").write_text(json.dumps(lm_eval_results(leak=0.0)))
    assert gate(tmp_path / "out" / "res.json", "--max-leak", "0.1") == 0
    assert gate(tmp_path / "out" / "other.json", "--max-leak", "0.1") == 2


def test_every_field_of_a_run_is_gated_and_lift_is_a_criterion(tmp_path, capsys):
    """A run over several fields: one subject per field and method (``field/method``), or one field with --field;
    --min-lift reads the null-calibrated lift."""
    good, bad = method(0.05, 0.9, 0.92), method(0.05, 0.9, 0.92)
    good["auc"]["forget"]["best_lift"] = {"score": "raw", "value": 0.3}
    bad["auc"]["forget"]["best_lift"] = {"score": "raw", "value": 0.01}
    path = run_results(tmp_path, {"oracle_grad": good})
    doc = json.loads(path.read_text())
    doc["by_field"] = {"email": {"methods": {"oracle_grad": good}}, "phone": {"methods": {"oracle_grad": bad}}}
    path.write_text(json.dumps(doc))
    assert gate(path, "--max-leak", "0.1") == 0
    out = capsys.readouterr().out
    assert "email/oracle_grad" in out and "phone/oracle_grad" in out
    assert gate(path, "--min-lift", "0.1") == 1  # phone's lift 0.01 fails
    assert "phone/oracle_grad" in capsys.readouterr().out
    assert gate(path, "--field", "email", "--min-lift", "0.1") == 0
    assert gate(path, "--field", "birth_city", "--max-leak", "0.1") == 2


def test_min_auc_gates_the_calibrated_best_not_the_uncalibrated_one(tmp_path, capsys):
    """A method-free update whose uncalibrated best (a family the null updates already win) reads 0.97 while its
    calibrated best is 0.50 must fail --min-auc; with no calibration in the results, --min-auc is missing, not
    passed on the uncalibrated number."""
    path = run_results(tmp_path, {"weight_decay": method(0.05, 0.9, 0.97, calibrated=0.50)})
    assert gate(path, "--min-auc", "0.8") == 1
    assert "auc_forget_calibrated" in capsys.readouterr().out
    uncalibrated = method(0.05, 0.9, 0.97)
    for target in ("forget", "unified"):
        del uncalibrated["auc"][target]["calibrated_best"]
    path = run_results(tmp_path / "u", {"no_null": uncalibrated})
    assert gate(path, "--min-auc", "0.8") == 1
    assert "MISSING" in capsys.readouterr().out


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_an_infinite_value_fails_whichever_way_the_criterion_points(tmp_path, value):
    """-inf is <= any leak threshold and inf >= any AUC threshold: both used to pass. A non-finite value fails."""
    entry = method(value, 0.9, 0.9)
    entry["auc"]["forget"]["calibrated_best"]["value"] = value
    entry["auc"]["forget"]["best_lift"] = {"score": "raw", "value": value}
    path = run_results(tmp_path, {"m": entry})
    assert gate(path, "--max-leak", "0.1") == 1
    assert gate(path, "--min-auc", "0.5") == 1
    assert gate(path, "--min-lift", "0.0") == 1
    assert gate(path, "--check", "forget_leak<=0.5") == 1
    [verdict] = evaluate(load_subjects(path), [Criterion("max-leak", "forget_leak", "<=", 1.0)])
    assert verdict.status == FAIL and "not a finite number" in verdict.message


@pytest.mark.parametrize(
    "args",
    [
        ("--max-leak", "inf"),
        ("--min-auc=-inf",),
        ("--max-leak", "1.5"),
        ("--min-retain=-0.1",),
        ("--min-auc", "1.01"),
        ("--min-lift=-2",),
        ("--check", "forget_leak<=inf"),
        ("--check", "auc_forget_calibrated>=1.5"),
    ],
)
def test_a_threshold_no_value_can_meet_or_miss_is_refused(tmp_path, capsys, args):
    try:
        code = gate(run_results(tmp_path), *args)
    except SystemExit as exc:  # argparse refuses a non-finite number itself
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "finite" in err or "outside" in err, err


def test_thresholds_at_the_ends_of_a_range_are_accepted(tmp_path):
    entry = method(0.0, 1.0, 1.0)
    entry["auc"]["forget"]["best_lift"] = {"score": "raw", "value": -1.0}
    path = run_results(tmp_path, {"m": entry})
    assert gate(path, "--max-leak", "0", "--min-retain", "1", "--min-auc", "1", "--min-lift=-1") == 0
    assert gate(path, "--check", "frag>=-5") == 0  # unbounded metrics take any finite threshold


def test_a_check_on_methods_name_reads_every_field_of_the_run(tmp_path, capsys):
    """``--check 'methods.NAME.…'`` on a run over several fields used to read the first field only and passed a run
    where the other fields leaked 1.0."""
    good, bad = method(0.0, 0.9, 0.9), method(1.0, 0.9, 0.9)
    path = run_results(tmp_path, {"oracle_grad": good})
    doc = json.loads(path.read_text())
    doc["by_field"] = {
        "email": {"methods": {"oracle_grad": good}},
        "phone": {"methods": {"oracle_grad": bad}},
        "birth_city": {"methods": {"oracle_grad": bad}},
    }
    path.write_text(json.dumps(doc))
    assert gate(path, "--check", "methods.oracle_grad.behaviour.forget_leak<=0.1") == 1
    out = capsys.readouterr().out
    assert "email/oracle_grad" in out and "phone/oracle_grad" in out and "birth_city/oracle_grad" in out
    assert gate(path, "--field", "email", "--check", "methods.oracle_grad.behaviour.forget_leak<=0.1") == 0
    assert gate(path, "--check", "methods.nonesuch.behaviour.forget_leak<=0.1") == 1  # missing, not passed


def test_every_seed_of_a_multi_seed_run_is_gated(tmp_path, capsys):
    """Only the first of ``--seeds`` was gated (issue 37 item 4): a second seed that leaked 0.9 passed. Each further
    seed is now a subject of its own, read from ``across_seeds``; a metric not summarised there reads MISSING."""
    entry = method(0.05, 0.9, 0.92)
    entry["across_seeds"] = {
        "seeds": [1, 2, 3],
        "metrics": {
            "behaviour.forget_leak": {"mean": 0.33, "sd": 0.5, "values": [0.05, 0.9, 0.05]},
            "auc.forget.calibrated_best": {"mean": 0.9, "sd": 0.01, "values": [0.92, 0.91, 0.9]},
        },
        "regimes": ["x", "y", "z"],
    }
    path = run_results(tmp_path, {"oracle_grad": entry})
    json_out = tmp_path / "gate.json"
    assert gate(path, "--max-leak", "0.1", "--min-auc", "0.85", "--json", json_out) == 1
    status = {(v["subject"], v["criterion"]): v["status"] for v in json.loads(json_out.read_text())["verdicts"]}
    assert status == {
        ("oracle_grad", "max-leak"): PASS,
        ("oracle_grad [seed 2]", "max-leak"): FAIL,  # the seed the old gate never read
        ("oracle_grad [seed 3]", "max-leak"): PASS,
        ("oracle_grad", "min-auc"): PASS,
        ("oracle_grad [seed 2]", "min-auc"): PASS,
        ("oracle_grad [seed 3]", "min-auc"): PASS,
    }
    assert gate(path, "--min-retain", "0.5") == 1  # not summarised across seeds: MISSING for seeds 2 and 3
    assert "MISSING" in capsys.readouterr().out
    assert gate(path, "--check", "methods.oracle_grad.behaviour.forget_leak<=0.1") == 0  # dotted: the file's entry
