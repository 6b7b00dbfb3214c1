"""Every gradient method a few steps on the smoke testbed (masked-injected model, its own forget/retain split):
the forget NLL moves the right way (up), restricted runs keep out-of-mask scalars."""

from __future__ import annotations

import pytest

from lacuna_metrics.masks import load_masks
from lacuna_tasks.loader import load_data
from lacuna_unlearn.methods import make_method
from lacuna_unlearn.trainer import TrainConfig, unlearn
from lacuna_unlearn.unlearn_data import split_rows

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
