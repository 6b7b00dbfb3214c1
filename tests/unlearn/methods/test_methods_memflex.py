"""MemFlex (docs/definitions.md#memflex): the localisation rule on hand-made gradients. Training on the tiny
memorizing model, the Hydra app and the errors: tests/e2e/test_memflex_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from lacuna_unlearn.methods import make_method
from lacuna_unlearn.methods.memflex import MemFlex, cosine, located, randomize_answer

# --------------------------------------------------------------------------- the rule, by hand


def test_cosine_and_rule_on_hand_made_gradients() -> None:
    g_u, g_r = torch.tensor([3.0, 4.0]), torch.tensor([4.0, 3.0])  # cos = 24/25 = 0.96, mean|g_u| = 3.5
    assert cosine(g_u, g_r) == 0.96
    assert not located(g_u, g_r, cos_threshold=0.96, grad_threshold=0.0)  # cos exactly at the threshold: out
    assert located(g_u, g_r, cos_threshold=0.97, grad_threshold=0.0)
    assert not located(g_u, g_r, cos_threshold=0.97, grad_threshold=3.5)  # magnitude exactly at it: out
    assert located(g_u, g_r, cos_threshold=0.97, grad_threshold=3.49)
    assert not located(g_u, 2 * g_u, cos_threshold=0.92, grad_threshold=0.0)  # same direction: shared knowledge
    assert cosine(g_u, -g_u) == -1.0 and located(g_u, -g_u, cos_threshold=0.92, grad_threshold=1.0)
    # matrices are compared flattened: [[1, 0], [0, 0]] vs [[0, 1], [0, 0]] are orthogonal; mean|g_u| = 0.25
    a, b = torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    assert cosine(a, b) == 0.0 and located(a, b, 0.92, 0.2) and not located(a, b, 0.92, 0.25)


def test_zero_gradients_follow_sklearn_and_are_never_located() -> None:
    zero, g = torch.zeros(2, 3), torch.ones(2, 3)
    assert cosine(zero, g) == cosine(g, zero) == cosine(zero, zero) == 0.0  # sklearn: a zero row has cosine 0
    assert not located(zero, g, cos_threshold=0.92, grad_threshold=0.0)  # e.g. lora_A while lora_B is still 0
    assert located(g, zero, cos_threshold=0.92, grad_threshold=0.5)  # no retain gradient: cosine 0 < 0.92
    with pytest.raises(ValueError, match="grad_threshold must be >= 0"):
        MemFlex(grad_threshold=-1.0)
    with pytest.raises(ValueError, match="forget_factor must be negative"):
        make_method("memflex", forget_factor=0.6)


def test_random_labels_touch_half_the_answer_draws_only() -> None:
    item = {"input_ids": torch.arange(10, 20), "labels": torch.tensor([-100] * 4 + list(range(14, 20)))}
    out = randomize_answer(item, vocab_size=1000, generator=torch.Generator().manual_seed(0))
    again = randomize_answer(item, vocab_size=1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out["input_ids"], again["input_ids"])  # seeded
    assert torch.equal(out["input_ids"][:4], item["input_ids"][:4])  # the prompt is untouched
    assert torch.equal(out["labels"][:4], item["labels"][:4])
    assert torch.equal(out["input_ids"][4:], out["labels"][4:])  # input and label replaced together
    assert 1 <= int((out["labels"][4:] != item["labels"][4:]).sum()) <= 3  # 6 answer tokens -> 3 draws
    assert torch.equal(item["labels"][4:], torch.arange(14, 20))  # the input item is not modified


def _compose(*overrides: str):  # noqa: ANN202
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        return compose(config_name="unlearn", overrides=["output_dir=o", *overrides])


def test_method_file_composes_with_experiment_and_overrides() -> None:
    cfg = _compose("method=memflex", "experiment=mini", "method.args.grad_threshold=1e-5", "lora.r=4")
    assert cfg.method.name == "memflex" and cfg.method.args.grad_threshold == 1e-5
    assert cfg.method.args.forget_factor == -0.6 and cfg.method.args.retain_factor == 2.0
    assert cfg.trainer.args.num_train_epochs == 60 and cfg.lora.r == 4  # experiment and command line still apply
    make_method(cfg.method.name, **cfg.method.args)  # every yaml key is a MemFlex argument


def test_method_file_switches_lora_on() -> None:
    cfg = _compose("method=memflex")
    assert cfg.lora.enabled and cfg.lora.r == 8 and cfg.lora.lora_alpha == 32 and cfg.lora.lora_dropout == 0.1
