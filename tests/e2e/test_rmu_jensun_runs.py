"""RMU and JensUn unlearn the tiny memorizing model end to end through ``lacuna_unlearn.trainer.loop.unlearn`` (the
losses: tests/unlearn/methods/test_methods_rmu_jensun.py).
"""

from __future__ import annotations

import json

import torch

from lacuna_unlearn.methods.jensun import JensUn
from lacuna_unlearn.methods.losses import jensun_forget_loss, nll_loss
from lacuna_unlearn.methods.rmu import RMU
from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn

# --------------------------------------------------------------------------- end to end


def _forget_eval(model_dir, rows, method):
    """(method's forget loss, forget NLL of the true answers) on all forget rows, no grad."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    batch = collate_forget_retain(tok.pad_token_id)([{"forget": x} for x in QADataset(rows, tok)])["forget"]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if isinstance(method, RMU):
            forget = method.forget_term(model, {"forget": batch})
        else:
            forget = jensun_forget_loss(logits, batch["labels"], method.refusal_ids)
    return float(forget), float(nll_loss(logits, batch["labels"]))


def test_rmu_and_jensun_unlearn_the_tiny_model(tiny_lacuna, tmp_path, tiny_email_rows):
    from transformers import AutoTokenizer

    forget, retain = tiny_email_rows
    jensun = JensUn()
    jensun.prepare(AutoTokenizer.from_pretrained(tiny_lacuna.model_dir))  # until the trainer calls prepare()
    for name, method in (("rmu", RMU()), ("jensun", jensun)):
        before, nll_before = _forget_eval(tiny_lacuna.model_dir, forget, method)
        out = unlearn(
            tiny_lacuna.model_dir,
            forget,
            retain,
            method,
            tmp_path / name,
            train=TrainConfig(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=2),
            method_name=name,
        )
        after, nll_after = _forget_eval(out, forget, method)
        if name == "rmu":
            assert after < 0.5 * before, (before, after)
        else:  # the JSD saturates at ln 2 far from the target, so it moves slowly at first
            assert after < before - 0.1, (before, after)
            assert nll_after > nll_before + 0.5, (nll_before, nll_after)
        manifest = json.loads((out / "unlearn_manifest.json").read_text())
        assert manifest["method"] == name and manifest["steps"] == 6
        assert set(manifest["last_method_logs"]) == {"forget_loss", "retain_loss"}
        if name == "rmu":
            assert manifest["method_args"]["layer"] == method.layer >= 0
        else:
            assert manifest["method_args"]["refusal_ids"] == list(method.refusal_ids)
