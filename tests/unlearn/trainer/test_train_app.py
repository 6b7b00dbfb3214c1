"""The ``lacuna-unlearn`` Hydra app's paper presets compose (real subprocess runs: tests/e2e/test_train_app_cli.py)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "experiment,expected",
    [
        ("lacuna_1b/simnpo", {"name": "simnpo", "gamma": 3.0, "alpha": 0.01, "beta": 10.0, "delta": 1.5, "lr": 1e-4}),
        ("lacuna_7b/oracle_grad", {"name": "grad_diff", "gamma": 1.0, "alpha": 0.5, "lr": 5e-5}),
    ],
)
def test_paper_presets_compose(experiment, expected):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lacuna_unlearn.configs", version_base="1.3"):
        cfg = compose(config_name="unlearn", overrides=[f"experiment={experiment}", "output_dir=o"])
    assert cfg.method.name == expected["name"]
    for key in ("gamma", "alpha", "beta", "delta"):
        if key in expected:
            assert cfg.method.args[key] == expected[key]
    assert cfg.trainer.args.learning_rate == expected["lr"] and cfg.trainer.args.num_train_epochs == 200
    if experiment.endswith("oracle_grad"):
        assert cfg.method.restrict == "forget_mask"
