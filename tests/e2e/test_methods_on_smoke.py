"""Every gradient method a few steps on the smoke testbed (masked-injected model, its own forget/retain split):
the forget NLL moves the right way (up), restricted runs keep out-of-mask scalars. The localization-first
methods (MemFlex, AlphaEdit) also lower the greedy forget leak (WAGLE and SP: tests/e2e/test_wagle_sp_runs.py)."""

from __future__ import annotations

import pytest
from helpers import REPO

from lacuna_metrics.masks import load_masks
from lacuna_tasks.loader import load_data
from lacuna_unlearn.methods import make_method
from lacuna_unlearn.qa.unlearn_data import split_rows
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn

METHODS = [
    ("grad_ascent", {}, "none"),
    ("grad_diff", {}, "none"),
    ("grad_diff", {}, "forget_mask"),  # OracleGrad
    ("npo", {}, "none"),
    ("simnpo", {}, "none"),
    ("rmu", {"steering_coeff": 20.0}, "none"),
    ("jensun", {}, "none"),
    ("undial", {}, "none"),
    ("idk_dpo", {"beta": 0.5}, "none"),
    ("rlabel", {}, "none"),
]


@pytest.mark.parametrize("name,args,restrict", METHODS, ids=[f"{n}-{r}" for n, _, r in METHODS])
def test_method_raises_the_forget_nll_on_the_smoke_testbed(smoke_testbed, forget_nll, tmp_path, name, args, restrict):
    data = load_data(smoke_testbed)
    forget, retain = split_rows(data, "forget", "all"), split_rows(data, "retain", "all")
    model = smoke_testbed / "model"
    out = unlearn(
        model, forget, retain, make_method(name, **args), tmp_path / name,
        train=TrainConfig(learning_rate=1e-2 if restrict == "none" else 3e-2, max_steps=6, per_device_train_batch_size=8),
        restrict=restrict, masks=load_masks(smoke_testbed / "masks.safetensors") if restrict != "none" else None,
    )  # fmt: skip
    before, after = forget_nll(model, forget), forget_nll(out, forget)
    assert after > before + 0.1, (name, before, after)


def test_memflex_lowers_the_forget_leak_on_the_smoke_testbed(smoke_testbed, leak_and_nll, tmp_path) -> None:
    from lacuna_unlearn.lora import LoraSettings

    data = load_data(smoke_testbed)
    forget, retain = split_rows(data, "forget", "all"), split_rows(data, "retain", "all")
    model = smoke_testbed / "model"
    out = unlearn(
        model, forget, retain, make_method("memflex", grad_threshold=0.0), tmp_path / "memflex",
        train=TrainConfig(learning_rate=1e-2, max_steps=6, per_device_train_batch_size=8),
        lora=LoraSettings(r=8, lora_alpha=32),
    )  # fmt: skip
    (leak_before, nll_before), (leak_after, nll_after) = leak_and_nll(model, forget), leak_and_nll(out, forget)
    assert leak_before > 0.5 and leak_after < leak_before, (leak_before, leak_after)
    assert nll_after > nll_before + 0.1, (nll_before, nll_after)


def test_alpha_edit_mini_preset_lowers_the_forget_leak_on_the_smoke_testbed(smoke_testbed, leak_and_nll, tmp_path):
    """The ``experiment=mini/alpha_edit`` settings (the smoke model has the mini architecture, 4 layers)."""
    import yaml

    from lacuna_tasks.prompts import qa_text
    from lacuna_unlearn.methods.alpha_edit.edit import AlphaEditConfig, edit_requests, run_alpha_edit

    preset = REPO / "lacuna_unlearn/configs/experiment/mini/alpha_edit.yaml"
    cfg = AlphaEditConfig(**{**yaml.safe_load(preset.read_text())["method"]["args"], "v_num_grad_steps": 40})
    data = load_data(smoke_testbed)
    forget = split_rows(data, "forget", "email")
    preserved = [qa_text(r["question"], r["answer"]) for r in data.splits["retain"]]
    model = smoke_testbed / "model"
    out = run_alpha_edit(model, edit_requests(forget, cfg.target), preserved, tmp_path / "ae", cfg)
    (leak_before, nll_before), (leak_after, nll_after) = leak_and_nll(model, forget), leak_and_nll(out, forget)
    assert leak_before > 0.5 and leak_after < leak_before, (leak_before, leak_after)
    assert nll_after > nll_before, (nll_before, nll_after)
