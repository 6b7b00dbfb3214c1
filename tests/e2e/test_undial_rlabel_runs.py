"""UNDIAL, RLabel and IdkDPO: short real trainer runs on the tiny memorizing model (the forget NLL must rise; the
refusal side is built once). Hand-computed values: tests/unlearn/methods/test_methods_undial_rlabel.py.
"""

from __future__ import annotations

import pytest
import torch

from lacuna_unlearn.methods import make_method
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


@pytest.mark.parametrize(
    "name,args", [("undial", {"beta": 10.0}), ("rlabel", {}), ("grad_diff", {"retain_loss_type": "kl"})]
)
def test_methods_raise_the_forget_nll(tiny_lacuna, tiny_email_rows, forget_nll, tmp_path, name, args):
    forget, retain = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir, forget, retain, make_method(name, **args), tmp_path / name,
        train=TrainConfig(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=2),
    )  # fmt: skip
    assert forget_nll(out, forget) > forget_nll(tiny_lacuna.model_dir, forget) + 0.5


def test_idk_dpo_prefers_the_refusal(tiny_lacuna, tiny_email_rows, forget_nll, tmp_path):
    forget, retain = tiny_email_rows
    method = make_method("idk_dpo", beta=0.5)
    out = unlearn(
        tiny_lacuna.model_dir, forget, retain, method, tmp_path / "idk",
        train=TrainConfig(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=2),
    )  # fmt: skip
    refusals = [{**r, "answer": "I don't know."} for r in forget]
    assert forget_nll(out, forget) > forget_nll(tiny_lacuna.model_dir, forget) + 0.5
    assert forget_nll(out, refusals) < forget_nll(tiny_lacuna.model_dir, refusals)
    assert method.refusal_ids  # prepared by the trainer


def test_idk_dpo_refusal_side_is_built_once_with_the_same_loss(tiny_lacuna, tiny_email_rows, tmp_path, monkeypatch):
    """The refusal side of IdkDPO's pairs is encoded once, with the data (one ``with_answer`` per forget item, no
    per-step ``replace_answers``), and gives the loss the per-step construction gave."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import lacuna_unlearn.methods.idk_dpo as idk_module
    import lacuna_unlearn.qa.unlearn_data as data_module
    from lacuna_unlearn.qa.unlearn_data import QADataset, collate_forget_retain

    forget, retain = tiny_email_rows
    calls = {"with_answer": 0, "replace_answers": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(data_module, "with_answer", counted("with_answer", data_module.with_answer))
    monkeypatch.setattr(idk_module, "replace_answers", counted("replace_answers", idk_module.replace_answers))
    method = make_method("idk_dpo", beta=0.5)
    unlearn(
        tiny_lacuna.model_dir, forget, retain, method, tmp_path / "idk",
        train=TrainConfig(learning_rate=1e-3, max_steps=3, per_device_train_batch_size=1),
    )  # fmt: skip
    assert calls == {"with_answer": len(forget), "replace_answers": 0}

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir).float()
    ref = copy.deepcopy(model).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    fds, rds = QADataset(forget + retain[:2], tok), QADataset(retain[: len(forget) + 2], tok)
    alt = fds.with_answer(method.refusal_ids)
    collate = collate_forget_retain(tok.pad_token_id)
    items = [{"forget": fds[i], "forget_alternate": alt[i], "retain": rds[i]} for i in range(len(fds))]
    with_alternate = collate(items)
    per_step = {k: v for k, v in with_alternate.items() if k != "forget_alternate"}  # the old path
    loss_new, logs_new = method.loss(model, with_alternate, ref)
    loss_old, logs_old = method.loss(model, per_step, ref)
    assert float(loss_new.detach()) == pytest.approx(float(loss_old.detach()), rel=1e-6, abs=1e-7)
    assert logs_new == pytest.approx(logs_old, rel=1e-6, abs=1e-7) and logs_new["forget_loss"] > 0.0
    rebuilt = idk_module.replace_answers(with_alternate["forget"], method.refusal_ids)
    mask = rebuilt["attention_mask"].bool()
    assert torch.equal(rebuilt["labels"], with_alternate["forget_alternate"]["labels"])
    assert torch.equal(rebuilt["input_ids"][mask], with_alternate["forget_alternate"]["input_ids"][mask])
