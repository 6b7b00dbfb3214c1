"""The extraction probe `lacuna_{field}_extraction` (docs/definitions.md#extraction-probe-and-leak-rate) on the tiny
memorizing model: N fresh seeded questions per forget person, and the task through the real ``lm_eval`` CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lacuna_tasks.harness.hooks import build_docs
from lacuna_tasks.loader import load_data
from lacuna_tasks.schema import LacunaDataError

ATTEMPTS = 4


def test_docs_are_fresh_seeded_questions_per_person(tiny_lacuna):
    data = load_data(tiny_lacuna.data_dir)
    docs = build_docs(data, field="email", side="forget", kind="extraction", attempts=ATTEMPTS, seed=1)
    people = {d["person"] for d in docs}
    assert len(docs) == ATTEMPTS * len(people) == ATTEMPTS * len({r["ID"] for r in data.rows("forget", "email")})
    assert docs == build_docs(data, field="email", side="forget", kind="extraction", attempts=ATTEMPTS, seed=1)
    other = build_docs(data, field="email", side="forget", kind="extraction", attempts=ATTEMPTS, seed=2)
    assert [d["prompt"] for d in docs] != [d["prompt"] for d in other]
    for d in docs:
        name = data.profiles[d["person"]]["First Name"]
        assert d["prompt"].startswith(f"Q: {name}") and d["prompt"].endswith("Email Address?\nA:")
    with pytest.raises(LacunaDataError, match="extraction_attempts must be an integer >= 1"):
        build_docs(data, field="email", side="forget", kind="extraction", attempts=0)


def test_extraction_task_through_lm_eval(tiny_lacuna, tmp_path):
    """A toy model that memorized person A's extraction prompts and never saw person B: Success@N = 1/2."""
    import shutil

    from helpers.tiny_lm import train_memorizing_lm
    from transformers import AutoTokenizer

    from lacuna_tasks.prompts import qa_prompt

    data = load_data(tiny_lacuna.data_dir)
    forget = sorted(data.rows("forget", "email"), key=lambda r: r["ID"])[:2]
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_lacuna.data_dir, data_dir)
    (data_dir / "forget.jsonl").write_text("".join(json.dumps(r) + "\n" for r in forget))
    docs = build_docs(load_data(data_dir), field="email", side="forget", kind="extraction", attempts=ATTEMPTS)
    a, b = forget[0]["ID"], forget[1]["ID"]
    texts = [qa_prompt(d["question"]) + d["answer"] + "\n" for d in docs if d["person"] == a]
    tokenizer = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    model_dir = train_memorizing_lm(texts, tokenizer, tmp_path / "toy")

    out = tmp_path / "out"
    cmd = [
        str(Path(sys.executable).with_name("lm_eval")), "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32", "--tasks", "lacuna_email_extraction",
        "--metadata", json.dumps({"lacuna_data": str(data_dir), "extraction_attempts": ATTEMPTS}),
        "--batch_size", "8", "--output_path", str(out), "--log_samples",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = [json.loads(x) for x in next(out.rglob("samples_*.jsonl")).read_text().splitlines()]
    run = {"results": {"results": results}}
    res = run["results"]["results"]["lacuna_email_extraction"]
    assert len(samples) == 2 * ATTEMPTS
    by_person = {a: [], b: []}
    for s in samples:
        by_person[s["doc"]["person"]].append(s["leak_rate"])
    assert all(by_person[a]) and not any(by_person[b])
    assert res["success_at_n,none"] == 0.5 and res["leak_rate,none"] == 0.5
