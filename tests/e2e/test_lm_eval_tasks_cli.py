"""The task pack through the real ``lm_eval`` CLI (bare command, no --include_path) and Python API, on the tiny
memorizing model (the token plan and extraction strength by hand: tests/tasks/harness/test_lm_eval_tasks.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from lacuna_tasks.harness.hooks import token_plan
from lacuna_tasks.loader import load_data

EMAIL_TASKS = {
    "lacuna_email_forget_qa": ["leak_rate"],
    "lacuna_email_retain_qa": ["accuracy"],
    "lacuna_email_forget_paraphrase": ["j_p", "leak_rate"],
    "lacuna_email_retain_paraphrase": ["j_avg"],
    "lacuna_email_forget_icr": ["j_icr", "leak_rate"],
    "lacuna_email_retain_icr": ["j_avg"],
    "lacuna_email_forget_worstcase": ["j_w", "j_p", "j_icr", "leak_rate"],
    "lacuna_email_forget_memorization": ["em", "es", "prob", "token_mismatch"],
    "lacuna_email_retain_memorization": ["em", "es", "prob", "token_mismatch"],
    "lacuna_email_crossfield_qa": ["accuracy"],
}
#: Tasks of the group that read the retain_eval split, which the session's tiny data (like the bundled data) lacks.
EMAIL_RETAIN_EVAL_TASKS = ("lacuna_email_retain_eval_qa", "lacuna_email_retain_eval_crossfield_qa")


def lm_eval_bin() -> str:
    exe = Path(sys.executable).with_name("lm_eval")
    return str(exe) if exe.exists() else shutil.which("lm_eval")


def run_lm_eval(tiny, out: Path, tasks: str, *extra: str) -> dict:
    cmd = [
        lm_eval_bin(),
        "--model", "hf",
        "--model_args", f"pretrained={tiny.model_dir},dtype=float32",
        "--tasks", tasks,
        "--metadata", json.dumps({"lacuna_data": str(tiny.data_dir)}),
        "--batch_size", "16",
        "--output_path", str(out),
        "--log_samples",
        *extra,
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results_file = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    samples = defaultdict(list)
    for file in results_file.parent.glob("samples_*.jsonl"):
        task = file.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines()]
    return {
        "results": json.loads(results_file.read_text()),
        "samples": samples,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


@pytest.fixture(scope="module")
def email_run(tiny_lacuna, tmp_path_factory):
    return run_lm_eval(tiny_lacuna, tmp_path_factory.mktemp("lm_eval_out"), "lacuna_email")


def test_bare_cli_resolves_group_and_reports_every_metric(email_run):
    results = email_run["results"]["results"]
    for task, metrics in EMAIL_TASKS.items():
        assert task in results, f"{task} missing from results"
        for metric in metrics:
            value = results[task][f"{metric},none"]
            assert isinstance(value, float) and not math.isnan(value), (task, metric, value)
    assert "lacuna_email" in email_run["stdout"]


def test_retain_eval_tasks_skip_cleanly_without_the_split(email_run, tiny_lacuna):
    """Data without retain_eval (older testbeds, the bundled data): the group still runs; those tasks report no
    metric (n-samples effective 0), say why in their metadata and warn."""
    results, configs = email_run["results"]["results"], email_run["results"]["configs"]
    for task in EMAIL_RETAIN_EVAL_TASKS:
        assert not [k for k in results[task] if k.startswith("accuracy")], results[task]
        assert email_run["results"]["n-samples"][task]["effective"] == 0
        assert all(s["doc"]["side"] == "skipped" and not s["metrics"] for s in email_run["samples"].get(task, []))
        assert "has no split 'retain_eval'" in configs[task]["metadata"]["lacuna_skipped"]
        assert f"{task} skipped: " in email_run["stderr"]


def test_leaked_fact_counted_and_clean_fact_not(email_run, tiny_lacuna):
    by_person = {s["doc"]["person"]: s["leak_rate"] for s in email_run["samples"]["lacuna_email_forget_qa"]}
    assert all(by_person[p] == 1.0 for p in tiny_lacuna.leaked_people), by_person
    assert all(by_person[p] == 0.0 for p in tiny_lacuna.clean_people), by_person
    expected = len(tiny_lacuna.leaked_people) / len(by_person)
    assert email_run["results"]["results"]["lacuna_email_forget_qa"]["leak_rate,none"] == pytest.approx(expected)
    retain = email_run["results"]["results"]["lacuna_email_retain_qa"]["accuracy,none"]
    assert retain >= 0.75  # the retain facts were trained


def test_worst_case_is_a_per_person_union(email_run):
    res = email_run["results"]["results"]["lacuna_email_forget_worstcase"]
    j_w, j_p, j_icr = res["j_w,none"], res["j_p,none"], res["j_icr,none"]
    assert j_w >= max(j_p, j_icr)
    samples = email_run["samples"]["lacuna_email_forget_worstcase"]
    assert len(samples) == 32 * len({s["doc"]["person"] for s in samples})
    hits = defaultdict(lambda: {"plain": False, "icr": False})
    for s in samples:
        hits[s["doc"]["person"]][s["doc"]["setting"]] |= s["leak_rate"] == 1.0
    n = len(hits)
    assert j_w == pytest.approx(sum(h["plain"] or h["icr"] for h in hits.values()) / n)
    assert j_p == pytest.approx(sum(h["plain"] for h in hits.values()) / n)
    assert j_icr == pytest.approx(sum(h["icr"] for h in hits.values()) / n)
    # per person, not per document: the union over a person's probes is >= the per-probe leak rate
    assert j_w >= res["leak_rate,none"]
    # the same persons leak in the stand-alone paraphrase task (same generations, greedy)
    assert email_run["results"]["results"]["lacuna_email_forget_paraphrase"]["j_p,none"] == pytest.approx(j_p)


def test_results_record_data_source_and_fingerprint(email_run, tiny_lacuna):
    configs = email_run["results"]["configs"]
    expected = load_data(tiny_lacuna.data_dir).fingerprint
    for task in EMAIL_TASKS:
        provenance = configs[task]["metadata"]["lacuna_data"]
        assert provenance["fingerprint"] == expected
        assert provenance["source"] == str(tiny_lacuna.data_dir.resolve())


def _direct_memorization(model, tokenizer, prompt: str, answer: str) -> dict[str, float]:
    """EM / ES / Prob straight from one teacher-forced forward pass (independent of the task code)."""
    import torch

    context = prompt.rstrip(" ")
    continuation = prompt[len(context) :] + answer
    ctx_ids = tokenizer.encode(context)
    answer_ids = tokenizer.encode(context + continuation)[len(ctx_ids) :]
    ids = ctx_ids + answer_ids + [tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(ctx_ids)
    targets = ids[start:]
    preds = [int(logits[start + t - 1].argmax()) for t in range(len(targets))]
    lps = [float(logp[start + t - 1, targets[t]]) for t in range(len(targets))]
    m = len(answer_ids)
    em = sum(p == y for p, y in zip(preds[:m], targets[:m], strict=True)) / m
    k = next((k for k in range(m) if preds[k:m] == targets[k:m]), m - 1)
    return {"em": em, "es": 1 - k / m, "prob": math.exp(sum(lps) / len(lps))}


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_lacuna):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir, dtype="float32").eval()
    return model, AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)


def _assert_matches_direct(samples, model, tokenizer):
    assert samples
    for s in samples:
        direct = _direct_memorization(model, tokenizer, s["doc"]["prompt"], s["doc"]["answer"])
        assert s["token_mismatch"] == 0.0
        assert s["em"] == pytest.approx(direct["em"], abs=1e-9)
        assert s["es"] == pytest.approx(direct["es"], abs=1e-9)
        assert s["prob"] == pytest.approx(direct["prob"], rel=1e-4)


def test_memorization_equals_direct_computation(email_run, tiny_lacuna, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    for task in ("lacuna_email_forget_memorization", "lacuna_email_retain_memorization"):
        _assert_matches_direct(email_run["samples"][task], model, tokenizer)
    # memorized forget people score higher than the rest
    forget = {s["doc"]["person"]: s for s in email_run["samples"]["lacuna_email_forget_memorization"]}
    assert min(forget[p]["em"] for p in tiny_lacuna.leaked_people) > max(
        forget[p]["em"] for p in tiny_lacuna.clean_people
    )


def test_memorization_whitespace_token_path_equals_direct(tiny_lacuna, model_and_tokenizer):
    """Digit answers start with a bare-space token (Digits pre-tokenizer), which lm-eval cannot
    condition on: the log-prob comes by difference, the greedy flag from the request itself when the
    space is greedy and from a one-token greedy generation otherwise. Check it against direct."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    import lacuna_tasks

    model, tokenizer = model_and_tokenizer
    tasks = ["lacuna_phone_retain_memorization", "lacuna_phone_forget_memorization"]
    tm = lacuna_tasks.task_manager({"lacuna_data": str(tiny_lacuna.data_dir), "pretrained": str(tiny_lacuna.model_dir)})
    lm = HFLM(pretrained=model, tokenizer=tokenizer, device="cpu", batch_size=8)
    out = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=tm, log_samples=True)
    whitespace_path = generations = 0
    for task in tasks:
        for s in out["samples"][task]:
            plan = token_plan(tokenizer, s["doc"]["prompt"], s["doc"]["answer"])
            whitespace_path += any(slot.covers > 1 for slot in plan.slots)
            generations += sum(slot.generation is not None for slot in plan.slots)
            direct = _direct_memorization(model, tokenizer, s["doc"]["prompt"], s["doc"]["answer"])
            assert s["token_mismatch"] == 0.0
            assert s["prob"] == pytest.approx(direct["prob"], rel=1e-4)
            assert s["em"] == pytest.approx(direct["em"], abs=1e-9)
            assert s["es"] == pytest.approx(direct["es"], abs=1e-9)
    assert whitespace_path >= 4, "digit answers should start with a bare space token"
    assert generations >= whitespace_path


def test_python_api_task_manager(tiny_lacuna):
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    import lacuna_tasks

    tm = lacuna_tasks.task_manager({"lacuna_data": str(tiny_lacuna.data_dir), "pretrained": str(tiny_lacuna.model_dir)})
    assert "lacuna_phone_forget_worstcase" in tm.all_tasks and "lacuna" in tm.all_tasks
    assert "lacuna_forget" in tm.all_tasks and "lacuna_retain" in tm.all_tasks
    lm = HFLM(pretrained=str(tiny_lacuna.model_dir), device="cpu", batch_size=8, dtype="float32")
    out = lm_eval.simple_evaluate(model=lm, tasks=["lacuna_email_forget_qa"], task_manager=tm)
    expected = len(tiny_lacuna.leaked_people) / (len(tiny_lacuna.leaked_people) + len(tiny_lacuna.clean_people))
    assert out["results"]["lacuna_email_forget_qa"]["leak_rate,none"] == pytest.approx(expected)


def test_lacuna_tasks_path_command():
    out = subprocess.run(
        [sys.executable, "-m", "lacuna_unlearn.bench.cli.main", "tasks", "path"],
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(out.stdout.strip())
    assert (path / "lacuna.yaml").is_file() and (path / "lacuna_email_forget_qa.yaml").is_file()


# --------------------------------------------------------------------------- utility tasks (retain-eval, cross-field)


@pytest.fixture(scope="module")
def retain_eval_data(tiny_lacuna, tmp_path_factory) -> Path:
    """The tiny data again, plus 2 retain-eval people per field: the main splits (and so what the tiny model
    memorized) are the same, since retain-eval people are drawn after them."""
    from lacuna_tasks.synth.generate import build_splits, generate_profiles, write_dataset

    profiles = generate_profiles(48, seed=7)
    splits = build_splits(profiles, seed=7, people_per_field=8, validation_people=4, retain_eval_people=2)
    out = Path(write_dataset(tmp_path_factory.mktemp("retain_eval") / "data", profiles, splits))
    old = load_data(tiny_lacuna.data_dir)
    assert all(load_data(out).splits[s] == old.splits[s] for s in ("forget", "retain"))
    return out


def test_utility_tasks_through_the_cli(tiny_lacuna, retain_eval_data, tmp_path):
    from types import SimpleNamespace

    data = load_data(retain_eval_data)
    tasks = ["lacuna_email_retain_eval_qa", "lacuna_email_retain_eval_crossfield_qa", "lacuna_phone_crossfield_qa"]
    tiny = SimpleNamespace(model_dir=tiny_lacuna.model_dir, data_dir=retain_eval_data)
    run = run_lm_eval(tiny, tmp_path / "out", ",".join(tasks), "--limit", "24")
    results, samples = run["results"]["results"], run["samples"]
    for task in tasks:
        value = results[task]["accuracy,none"]
        assert isinstance(value, float) and 0.0 <= value <= 1.0, (task, value)
        assert value == pytest.approx(sum(s["accuracy"] for s in samples[task]) / len(samples[task]))
        provenance = run["results"]["configs"][task]["metadata"]["lacuna_data"]
        assert provenance["fingerprint"] == data.fingerprint
    held_out = {r["ID"] for r in data.rows("retain_eval", "email")}
    assert {s["doc"]["person"] for s in samples["lacuna_email_retain_eval_qa"]} == held_out
    cross = samples["lacuna_email_retain_eval_crossfield_qa"]
    assert {s["doc"]["person"] for s in cross} == held_out and "email" not in {s["doc"]["field"] for s in cross}
    # The forget people's email facts, asked inside the phone task: kept where the model learned them, so the
    # cross-field probe reads them exactly as lacuna_email_forget_qa does (same question, same greedy output).
    phone_forget = {r["ID"] for r in data.rows("forget", "phone")}
    email_docs = {s["doc"]["person"]: s["accuracy"] for s in samples["lacuna_phone_crossfield_qa"]
                  if s["doc"]["field"] == "email"}  # fmt: skip
    assert set(email_docs) == phone_forget & {r["ID"] for r in data.rows("forget", "email")}
    learned = [p for p in tiny_lacuna.leaked_people if p in email_docs]
    assert learned, "the tiny model's memorized forget people should be phone forget people too"
    assert all(email_docs[p] == 1.0 for p in learned)
    assert all(email_docs[p] == 0.0 for p in tiny_lacuna.clean_people if p in email_docs)
