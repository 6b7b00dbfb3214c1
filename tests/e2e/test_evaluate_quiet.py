"""Our own lm-eval calls (`lacuna run`, `lacuna attack`) print results, not lm-eval's per-task notices."""

from __future__ import annotations

import logging

from lacuna_tasks.harness.evaluate import evaluate


def test_evaluate_drops_lm_eval_notices_and_restores_the_logger(tiny_lacuna, caplog, capfd):
    lm_eval_logger = logging.getLogger("lm_eval")
    level = lm_eval_logger.level
    with caplog.at_level(logging.INFO):
        out = evaluate(tiny_lacuna.model_dir, ["lacuna_email_forget_qa"], data=tiny_lacuna.data_dir, limit=2)
    assert "leak_rate" in out["results"]["lacuna_email_forget_qa"]
    captured = capfd.readouterr()
    text = caplog.text + captured.out + captured.err
    assert "Custom kwargs can be passed" not in text
    assert lm_eval_logger.level == level
