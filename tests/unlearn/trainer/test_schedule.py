"""The unlearning trainer's optimizer: restricted relearning's cosine decays to 10% of the peak with no step at
learning rate 0 (LACUNA's schedule, as the testbed's), and weight decay skips biases and norms as HF Trainer's own
parameter grouping does. The trainer is built as ``lacuna-unlearn attack=relearn_restricted`` builds it, without
training."""

from __future__ import annotations

import math

import pytest
from helpers.restrict import tiny_llama

from lacuna_unlearn.trainer.schedule import check_min_lr_ratio, warmup_cosine_factor


def _trainer_config(*overrides: str):
    """``trainer.args`` of a composed ``lacuna-unlearn`` config as the entry point turns them into a TrainConfig."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from lacuna_unlearn.trainer.loop import TrainConfig

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=[*overrides, "output_dir=x"])
    args = OmegaConf.to_container(cfg.trainer.args, resolve=True)
    known = set(TrainConfig.__dataclass_fields__) - {"extra", "seed"}
    return TrainConfig(**{k: v for k, v in args.items() if k in known})


def _trainer(train, tmp_path, steps: int):
    """An UnlearnTrainer with ``train``'s optimisation settings for ``steps`` optimizer steps, as ``unlearn`` makes
    it: TrainingArguments from the config, the optimizer's groups from :func:`param_groups`."""
    from transformers import TrainingArguments

    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.trainer.loop import UnlearnTrainer
    from lacuna_unlearn.trainer.restrict import param_groups, parse_restriction

    model = tiny_llama()
    args = TrainingArguments(
        output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True, learning_rate=train.learning_rate,
        max_steps=steps, weight_decay=train.weight_decay, lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_steps,
    )  # fmt: skip
    resolved = parse_restriction("none").resolve(model)
    trainer = UnlearnTrainer(
        model=model, args=args, method=make_method("finetune"), param_groups=param_groups(model, resolved,
        train.weight_decay), min_lr_ratio=train.min_lr_ratio,
    )  # fmt: skip
    return model, trainer


def _rates(trainer, steps: int) -> list[float]:
    """The learning rate each of ``steps`` optimizer steps runs at (the scheduler steps after the optimizer)."""
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    return rates


def test_restricted_relearning_never_steps_at_zero_and_ends_at_a_tenth_of_the_peak(tmp_path) -> None:
    train = _trainer_config("attack=relearn_restricted")
    assert train.lr_scheduler_type == "cosine" and train.min_lr_ratio == 0.1
    peak = train.learning_rate
    _, trainer = _trainer(train, tmp_path, steps=5)
    rates = _rates(trainer, 5)
    assert all(r > 0 for r in rates), rates
    assert rates[0] == pytest.approx(peak)  # a 10% warmup of 5 steps is one step, at the peak (HF's: at 0)
    assert rates[-1] == pytest.approx(0.1 * peak)
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))


@pytest.mark.parametrize(("warmup", "total"), [(0, 5), (1, 5), (2, 10), (3, 7), (1, 2), (10, 100)])
def test_the_schedule_warms_up_from_above_zero_and_ends_at_the_floor(warmup, total) -> None:
    factors = [warmup_cosine_factor(s, warmup=warmup, total=total, floor=0.1) for s in range(total)]
    assert all(f > 0 for f in factors)
    assert factors[-1] == pytest.approx(0.1)
    assert max(factors) == pytest.approx(1.0) and factors[max(warmup - 1, 0)] == pytest.approx(1.0)
    assert factors[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    cosine = factors[max(warmup - 1, 0) :]
    assert all(a > b for a, b in zip(cosine, cosine[1:], strict=False))
    mid = max(warmup - 1, 0) + (total - 1 - max(warmup - 1, 0)) / 2  # halfway down: the mean of peak and floor
    if mid == int(mid):
        assert factors[int(mid)] == pytest.approx(0.55)
    assert warmup_cosine_factor(0, warmup=0, total=1, floor=0.1) == 1.0  # one step: the peak
    assert not math.isnan(warmup_cosine_factor(total, warmup=warmup, total=total, floor=0.1))


def test_min_lr_ratio_is_checked_where_it_is_set() -> None:
    assert check_min_lr_ratio(None, "constant") is None
    assert check_min_lr_ratio(0, "cosine") == 0.0
    with pytest.raises(ValueError, match="min_lr_ratio must be a number in \\[0, 1\\]"):
        check_min_lr_ratio(1.5, "cosine")
    with pytest.raises(ValueError, match="min_lr_ratio must be a number"):
        check_min_lr_ratio(True, "cosine")
    with pytest.raises(ValueError, match="shapes the cosine schedule only; lr_scheduler_type is 'constant'"):
        check_min_lr_ratio(0.1, "constant")
    # the entry point's preflight refuses it before anything loads
    from hydra import compose, initialize_config_module

    from lacuna_unlearn.trainer.app import preflight

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=["attack=relearn_restricted", "output_dir=/tmp/never-made-x",
                                                        "trainer.args.lr_scheduler_type=linear"])  # fmt: skip
    with pytest.raises(ValueError, match="lr_scheduler_type is 'linear'"):
        preflight(cfg)


@pytest.mark.parametrize("preset", ["attack=relearn_restricted", "method=grad_diff"])
def test_weight_decay_skips_biases_and_norms(preset, tmp_path) -> None:
    """Relearning and unlearning share the optimizer: every norm gain and bias lands in a group with weight decay 0,
    every other weight in one with the configured decay (HF Trainer's ``get_decay_parameter_names``)."""
    train = _trainer_config(preset, "trainer.args.weight_decay=0.1")
    model, trainer = _trainer(train, tmp_path, steps=5)
    optimizer = trainer.create_optimizer()
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    norms = [n for n in names if "norm" in n]
    assert norms and all(decay[id(names[n])] == 0.0 for n in norms)
    weights = [n for n in names if "norm" not in n]
    assert all(decay[id(names[n])] == 0.1 for n in weights)
    assert set(decay) == {id(p) for p in model.parameters() if p.requires_grad}


def test_biases_get_no_weight_decay(tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from lacuna_unlearn.methods import make_method
    from lacuna_unlearn.trainer.loop import UnlearnTrainer
    from lacuna_unlearn.trainer.restrict import param_groups, parse_restriction

    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True, weight_decay=0.1)
    groups = param_groups(model, parse_restriction("none").resolve(model), 0.1)
    optimizer = UnlearnTrainer(model=model, args=args, method=make_method("finetune"), param_groups=groups)
    decay = {id(p): g["weight_decay"] for g in optimizer.create_optimizer().param_groups for p in g["params"]}
    for name, param in model.named_parameters():
        exempt = name.endswith(".bias") or ".ln_" in name  # GPT-2's LayerNorms: ln_1, ln_2, ln_f
        assert decay[id(param)] == (0.0 if exempt else 0.1), name
