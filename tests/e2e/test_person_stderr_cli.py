"""lm-eval's stderr of the per-person aggregates (J_P, J_ICR, J_W, Success@N) is taken over persons, not documents.

Through the real ``lm_eval`` CLI on the tiny model: the reported ``<metric>_stderr,none`` equals sd(per-person
values) / sqrt(n persons) recomputed by hand from ``--log_samples``, and differs from the same formula over
documents (each person has 16, 32 or N documents). By hand: tests/tasks/harness/test_person_stderr.py.
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

#: task -> its per-person metrics (aggregation per_person_any)
PER_PERSON = {
    "lacuna_email_forget_paraphrase": ["j_p"],
    "lacuna_email_forget_worstcase": ["j_w", "j_p", "j_icr"],
    "lacuna_email_extraction": ["success_at_n"],
}
ATTEMPTS = 3


def _sd_over_sqrt_n(values: list[float]) -> float:
    n = len(values)
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def _lm_eval(tiny, out: Path) -> tuple[dict, dict[str, list[dict]]]:
    exe = Path(sys.executable).with_name("lm_eval")
    cmd = [
        str(exe) if exe.exists() else shutil.which("lm_eval"),
        "--model", "hf",
        "--model_args", f"pretrained={tiny.model_dir},dtype=float32",
        "--tasks", ",".join(PER_PERSON),
        "--metadata", json.dumps({"lacuna_data": str(tiny.data_dir), "extraction_attempts": ATTEMPTS}),
        "--batch_size", "16",
        "--output_path", str(out),
        "--log_samples",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results_file = max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    samples = {}
    for file in results_file.parent.glob("samples_*.jsonl"):
        task = file.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines()]
    return json.loads(results_file.read_text()), samples


@pytest.mark.slow
def test_cli_stderr_is_over_persons(tiny_lacuna, tmp_path):
    results, samples = _lm_eval(tiny_lacuna, tmp_path / "out")
    checked = 0
    for task, metrics in PER_PERSON.items():
        res = results["results"][task]
        for metric in metrics:
            per_person: dict[str, bool] = {}
            per_doc: list[float] = []
            for s in samples[task]:
                person, hit = s[metric]
                if hit is None:
                    continue
                per_person[person] = per_person.get(person, False) or bool(hit)
                per_doc.append(float(hit))
            values = [float(v) for v in per_person.values()]
            assert len(per_doc) > len(values) >= 2, (task, metric)  # several documents per person
            assert res[f"{metric},none"] == pytest.approx(sum(values) / len(values))
            reported = res[f"{metric}_stderr,none"]
            assert isinstance(reported, float), (task, metric, reported)
            assert reported == pytest.approx(_sd_over_sqrt_n(values), rel=1e-12), (task, metric)
            if 0.0 < res[f"{metric},none"] < 1.0:  # persons differ: a real spread, over persons vs documents
                assert reported != pytest.approx(_sd_over_sqrt_n(per_doc), rel=1e-3), (task, metric)
                checked += 1
    # the tiny model leaks the email of 2 of its 8 forget persons: J_P, J_W and Success@N lie strictly inside (0, 1)
    assert checked >= 3, results["results"]
    # the per-document leak_rate keeps lm-eval's own stderr over documents
    leak = results["results"]["lacuna_email_forget_paraphrase"]
    docs = [float(s["leak_rate"]) for s in samples["lacuna_email_forget_paraphrase"]]
    assert leak["leak_rate_stderr,none"] == pytest.approx(_sd_over_sqrt_n(docs), rel=1e-9)
    by_person = defaultdict(int)
    for s in samples["lacuna_email_forget_worstcase"]:
        by_person[s["doc"]["person"]] += 1
    assert set(by_person.values()) == {32}
