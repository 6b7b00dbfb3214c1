"""The unlearning trainer on the tiny memorizing model: methods move the forget loss the right way,
OracleGrad leaves out-of-mask scalars bit-identical, outputs are loadable checkpoints with a manifest."""

from __future__ import annotations

import json

import pytest
import torch

from lacuna_unlearn.methods import make_method
from lacuna_unlearn.qa.unlearn_data import encode_qa
from lacuna_unlearn.trainer.loop import TrainConfig, unlearn


def test_labels_cover_the_answer_and_eos_only(tiny_lacuna):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    item = encode_qa(tok, "What is Ann's email?", "ann@example.com")
    labelled = item["input_ids"][item["labels"] != -100]
    assert tok.decode(labelled) == " ann@example.com\n" + tok.eos_token
    assert tok.decode(item["input_ids"]).startswith("Q: What is Ann's email?\nA:")


@pytest.mark.parametrize("name,args", [("grad_diff", {}), ("npo", {"beta": 0.1}), ("simnpo", {"beta": 4.5})])
def test_methods_raise_the_forget_loss(tiny_lacuna, tmp_path, name, args, tiny_email_rows, forget_nll):
    forget, retain = tiny_email_rows
    before = forget_nll(tiny_lacuna.model_dir, forget)
    out = unlearn(
        tiny_lacuna.model_dir,
        forget,
        retain,
        make_method(name, **args),
        tmp_path / name,
        train=TrainConfig(learning_rate=3e-3, max_steps=6, per_device_train_batch_size=2),
        method_name=name,
    )
    after = forget_nll(out, forget)
    assert after > before + 0.5, (before, after)
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == name and manifest["steps"] == 6 and manifest["seed"] == 42
    assert not (tmp_path / f"{name}.partial").exists()


def test_oracle_grad_leaves_out_of_mask_scalars_bit_identical(tiny_lacuna, tmp_path, tiny_email_rows):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lacuna_metrics.masks import build_masks, named_shapes_of

    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir)
    masks = build_masks(named_shapes_of(model), model.config.num_hidden_layers, budget=0.05, seed=0, skip_last=0)
    forget, retain = tiny_email_rows
    out = unlearn(
        tiny_lacuna.model_dir,
        forget,
        retain,
        make_method("grad_diff", gamma=1.0, alpha=1.0),
        tmp_path / "oracle",
        train=TrainConfig(learning_rate=3e-3, max_steps=4, per_device_train_batch_size=2, weight_decay=0.01),
        restrict="forget_mask",
        masks=masks,
    )
    before = {n: p.detach() for n, p in model.named_parameters()}
    after = load_file(str(out / "model.safetensors"))
    moved_inside = 0
    for name, old in before.items():
        new = after[name]
        if name in masks.packed:
            keep = masks.forget_mask(name)
            assert torch.equal(new[~keep], old[~keep]), name
            moved_inside += int((new[keep] != old[keep]).sum())
        else:
            assert torch.equal(new, old), name
    assert moved_inside > 0
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["restrict"] == "forget_mask" and manifest["out_of_mask_unchanged"] is True


def test_clear_errors(tiny_lacuna, tmp_path, tiny_email_rows):
    forget, retain = tiny_email_rows
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        make_method("nope")
    with pytest.raises(ValueError, match="forget split is empty"):
        unlearn(tiny_lacuna.model_dir, [], retain, make_method("grad_diff"), tmp_path / "x")
    with pytest.raises(ValueError, match="masks"):
        unlearn(tiny_lacuna.model_dir, forget, retain, make_method("grad_diff"), tmp_path / "y", restrict="forget_mask")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y.partial").exists()
