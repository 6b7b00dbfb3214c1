"""UNDIAL and RLabel against hand-computed values on tiny tensors, the KL-retain presets, and short real
trainer runs on the tiny memorizing model (the forget NLL must rise)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lacuna_unlearn.methods import METHODS, make_method
from lacuna_unlearn.methods.losses import IGNORE_INDEX, nll_loss, random_label_loss, undial_loss
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


def _brute_undial(logits, labels, ref, beta, masked):
    """Loop over positions: q = softmax(ref_t - beta * e_{y_{t+1}}), CE = -sum q log softmax(logits_t)."""
    total, count = 0.0, 0
    b, t, v = logits.shape
    for i in range(b):
        for j in range(t - 1):
            y = int(labels[i, j + 1])
            if masked and y == IGNORE_INDEX:
                continue
            k = y if y != IGNORE_INDEX else v - 100  # OpenUnlearning's negative indexing of -100
            target = ref[i, j].clone()
            target[k] -= beta
            q = torch.softmax(target, -1)
            total += float(-(q * torch.log_softmax(logits[i, j], -1)).sum())
            count += 1
    return total / count


@pytest.mark.parametrize("masked", [True, False])
def test_undial_matches_a_position_loop(masked):
    gen = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(2, 5, 120, generator=gen), torch.randn(2, 5, 120, generator=gen)
    labels = torch.tensor([[-100, -100, 3, 7, -100], [-100, 5, 6, 119, 2]])
    got = float(undial_loss(logits, labels, ref, beta=2.0, masked=masked))
    assert got == pytest.approx(_brute_undial(logits, labels, ref, 2.0, masked), rel=1e-5)


def test_undial_at_beta_zero_is_distillation_to_itself():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 10, generator=gen)
    labels = torch.tensor([[-100, 1, 2, 3]])
    p = torch.softmax(logits[0, :3], -1)
    entropy = float(-(p * torch.log(p)).sum(-1).mean())
    assert float(undial_loss(logits, labels, logits, beta=0.0)) == pytest.approx(entropy, rel=1e-5)
    with pytest.raises(ValueError, match="differ"):
        undial_loss(logits, labels, logits[:, :3])


def test_random_label_loss_is_nll_on_seeded_random_answer_tokens():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 4, 9, generator=gen)
    labels = torch.tensor([[-100, -100, 4, 5], [-100, 1, 2, -100]])
    got = random_label_loss(logits, labels, torch.Generator().manual_seed(7))
    random = torch.randint(0, 9, labels.shape, generator=torch.Generator().manual_seed(7))
    expected = nll_loss(logits, torch.where(labels == IGNORE_INDEX, labels, random))
    assert float(got) == pytest.approx(float(expected))
    assert float(got) == pytest.approx(
        float(
            F.cross_entropy(
                logits[:, :-1].reshape(-1, 9), torch.where(labels == -100, labels, random)[:, 1:].reshape(-1)
            )
        )
    )
    assert math.isfinite(float(random_label_loss(logits, torch.full_like(labels, -100))))


def test_registry_and_presets():
    from hydra import compose, initialize_config_module

    assert {"rlabel", "undial"} <= set(METHODS)
    assert make_method("undial").alpha == 0.0 and make_method("undial").needs_reference
    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        for preset, name in (("ga_kl", "grad_diff"), ("npo_kl", "npo")):
            cfg = compose(config_name="unlearn", overrides=[f"method={preset}", "output_dir=o"])
            assert cfg.method.name == name and cfg.method.args.retain_loss_type == "kl"
            assert make_method(cfg.method.name, **cfg.method.args).needs_reference


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


def test_dpo_loss_hand_values():
    from lacuna_unlearn.methods.losses import dpo_loss

    win, win_ref = torch.tensor([-2.0, -1.0]), torch.tensor([-3.0, -1.0])
    lose, lose_ref = torch.tensor([-1.0, -4.0]), torch.tensor([-2.0, -2.0])
    # margins: (1 - 1) = 0 and (0 - (-2)) = 2; beta 0.5 -> -mean log sigmoid([0, 1])
    expected = -(math.log(0.5) + math.log(1 / (1 + math.exp(-1.0)))) / 2
    assert float(dpo_loss(win, win_ref, lose, lose_ref, beta=0.5)) == pytest.approx(expected)
    scaled = dpo_loss(win, win_ref, lose, lose_ref, beta=0.5, openunlearning_scale=True)
    assert float(scaled) == pytest.approx(expected * 4.0)  # 2 / beta


def test_replace_answers_keeps_prompts_and_labels_the_new_answer():
    from lacuna_unlearn.trainer.unlearn_data import replace_answers

    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 8, 9], [5, 6, 11, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        "labels": torch.tensor([[-100, -100, -100, 8, 9], [-100, -100, 11, -100, -100]]),
    }
    out = replace_answers(batch, [42, 43])
    assert out["input_ids"].tolist() == [[5, 6, 7, 42, 43], [5, 6, 42, 43, 0]]
    assert out["labels"].tolist() == [[-100, -100, -100, 42, 43], [-100, -100, 42, 43, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    with pytest.raises(ValueError, match="empty answer"):
        replace_answers(batch, [])


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
    import lacuna_unlearn.trainer.unlearn_data as data_module
    from lacuna_unlearn.trainer.unlearn_data import QADataset, collate_forget_retain

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
