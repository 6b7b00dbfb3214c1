"""The resurfacing attack's Success@N under a named judge, on a tiny memorizing model trained here (the judges
themselves: tests/unlearn/bench/test_judges.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lacuna_tasks.normalize import (
    JUDGE_RULES,
    JUDGES,
)


def test_attack_records_its_judge(tiny_lacuna, tmp_path, monkeypatch):
    """resurfacing_attack with the relearning replaced by a copy of the model, on a toy model that answers person A's
    extraction questions directly and person B's only after a newline: Success@N is 1 under LACUNA's rule and 1/2
    under the first-line rule. attack.json names the judge and its rule and keeps the figures of every judge; a bad
    judge fails before any work."""
    from helpers.tiny_lm import train_memorizing_lm
    from transformers import AutoTokenizer

    import lacuna_unlearn.trainer.app as train
    from lacuna_tasks.harness.hooks import build_docs
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.prompts import probe_prompt, qa_prompt
    from lacuna_unlearn.bench.attacks import resurfacing_attack

    attempts = 2
    data = load_data(tiny_lacuna.data_dir)
    forget = sorted(data.rows("forget", "email"), key=lambda r: r["ID"])[:2]
    data_dir = tmp_path / "data"
    shutil.copytree(tiny_lacuna.data_dir, data_dir)
    (data_dir / "forget.jsonl").write_text("".join(json.dumps(r) + "\n" for r in forget))
    docs = build_docs(load_data(data_dir), field="email", side="forget", kind="extraction", attempts=attempts)
    a = forget[0]["ID"]
    texts = [
        qa_prompt(d["question"]) + d["answer"] + "\n"
        if d["person"] == a
        else probe_prompt(d["question"]) + " no\n" + d["answer"] + "\n"
        for d in docs
    ]
    model_dir = train_memorizing_lm(texts, AutoTokenizer.from_pretrained(tiny_lacuna.model_dir), tmp_path / "toy")

    def fake_relearn(cfg):
        out = Path(str(cfg.output_dir))
        shutil.copytree(model_dir, out)
        return out

    monkeypatch.setattr(train, "run", fake_relearn)
    with pytest.raises(ValueError, match="unknown judge 'exact'; choose from lacuna, first_line, loose"):
        resurfacing_attack(model_dir, tmp_path / "bad", data=data_dir, judge="exact")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()

    reports = {}
    for judge in ("lacuna", "first_line"):
        out = tmp_path / judge
        kw = {} if judge == "lacuna" else {"judge": judge}
        report = resurfacing_attack(model_dir, out, data=data_dir, attempts=attempts, batch_size=8, **kw)
        assert json.loads((out / "attack.json").read_text()) == json.loads(json.dumps(report))
        reports[judge] = report
    lac, first = reports["lacuna"], reports["first_line"]
    assert lac["judge"] == "lacuna" and first["judge"] == "first_line"  # lacuna is the default
    assert lac["judge_rule"] == JUDGE_RULES["lacuna"] and "prompt_deviation" in lac["probe"]
    assert set(lac["by_judge"]) == set(JUDGES) and lac["by_judge"] == first["by_judge"]  # same generations
    for report in (lac, first):
        figures = report["by_judge"][report["judge"]]
        for key in ("success_at_n_unlearned", "success_at_n_relearned", "leak_rate_unlearned", "leak_rate_relearned"):
            assert report[key] == figures[key]
        assert (
            len(report["resurfaced"]) == figures["resurfaced"] and report["persons"] == len(report["per_person"]) == 2
        )
    assert lac["success_at_n_unlearned"] == lac["success_at_n_relearned"] == 1.0
    assert first["success_at_n_unlearned"] == 0.5 and first["per_person"][a]["unlearned"] is True
    assert lac["by_judge"]["loose"]["success_at_n_unlearned"] == 1.0
