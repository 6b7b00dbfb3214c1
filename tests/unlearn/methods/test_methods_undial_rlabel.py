"""UNDIAL and RLabel against hand-computed values on tiny tensors, and the KL-retain presets. Short real trainer runs
on the tiny memorizing model: tests/e2e/test_undial_rlabel_runs.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lacuna_unlearn.methods import METHODS, make_method
from lacuna_unlearn.methods.losses import IGNORE_INDEX, nll_loss, random_label_loss, undial_loss


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
    from lacuna_unlearn.qa.unlearn_data import replace_answers

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
