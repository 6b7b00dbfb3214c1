"""RMU and JensUn: losses match direct computations on a tiny random Llama. Both unlearn the tiny memorizing model
end to end: tests/e2e/test_rmu_jensun_runs.py.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict

import pytest
import torch

from lacuna_unlearn.methods import METHODS, make_method
from lacuna_unlearn.methods.jensun import JensUn
from lacuna_unlearn.methods.losses import jensun_forget_loss, nll_loss, rmu_control_vector
from lacuna_unlearn.methods.rmu import RMU


def _tiny_llama(layers: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def _batch(seed: int) -> dict[str, torch.Tensor]:
    """Two right-padded sequences (lengths 8 and 6) with prompts of 3 and 4 tokens left unlabelled."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 64, (2, 8), generator=gen)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 6:] = 0
    ids[1, 6:] = 0
    labels = ids.clone()
    labels[0, :3] = -100
    labels[1, :4] = -100
    labels[1, 6:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _inputs() -> dict[str, dict[str, torch.Tensor]]:
    return {"forget": _batch(1), "retain": _batch(2)}


# --------------------------------------------------------------------------- RMU


def test_rmu_forget_loss_is_the_masked_mse_to_c_u():
    model = _tiny_llama(layers=4)
    inputs = _inputs()
    method = RMU(layer=2, steering_coeff=3.0, seed=7, retain_loss_type="nll")
    assert method.needs_reference is False
    loss, logs = method.loss(model, inputs, None)

    batch = inputs["forget"]
    with torch.no_grad():
        hidden = model(**{k: batch[k] for k in ("input_ids", "attention_mask")}, output_hidden_states=True)
    h = hidden.hidden_states[3]  # output of block 2
    target = 3.0 * rmu_control_vector(32, 7)
    sq = (h - target).pow(2).mean(dim=-1)  # [B, T]
    answer = batch["labels"] != -100  # unshifted answer-token mask
    expected = torch.stack([sq[b][answer[b]].mean() for b in range(2)]).mean()
    assert logs["forget_loss"] == pytest.approx(float(expected), rel=1e-5)
    retain_nll = nll_loss(model(input_ids=inputs["retain"]["input_ids"]).logits, inputs["retain"]["labels"])
    assert float(loss.detach()) == pytest.approx(float(expected) + float(retain_nll.detach()), rel=1e-5)

    # hidden_states[layer + 1] is what a forward hook on the block captures (for non-final blocks)
    captured = {}
    hook = model.model.layers[2].register_forward_hook(lambda m, i, o: captured.setdefault("h", o))
    with torch.no_grad():
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    hook.remove()
    out = captured["h"][0] if isinstance(captured["h"], tuple) else captured["h"]
    torch.testing.assert_close(out, h)


def test_rmu_embed_diff_is_zero_against_itself_and_layer_defaults_to_the_middle():
    model = _tiny_llama(layers=4)
    method = RMU()
    assert method.needs_reference is True and method.layer == -1
    loss, logs = method.loss(model, _inputs(), copy.deepcopy(model))
    assert method.layer == 1  # (4 - 1) // 2
    assert logs["retain_loss"] == 0.0
    assert float(loss.detach()) == pytest.approx(logs["forget_loss"]) and logs["forget_loss"] > 0
    model.train()
    loss.backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0
    assert model.model.layers[3].mlp.down_proj.weight.grad is None  # above the steered block
    json.dumps(asdict(method))  # manifest-safe: the cached control vector is not a field


def test_rmu_and_jensun_options_are_checked():
    assert METHODS["rmu"] is RMU and METHODS["jensun"] is JensUn
    assert isinstance(make_method("rmu", steering_coeff=6.5), RMU)
    with pytest.raises(ValueError, match="retain_loss_type"):
        make_method("rmu", retain_loss_type="jsd")
    with pytest.raises(ValueError, match="retain_loss_type"):
        make_method("jensun", retain_loss_type="embed_diff")
    with pytest.raises(ValueError, match="out of range"):
        RMU(layer=4).loss(_tiny_llama(layers=4), _inputs(), None)
    assert JensUn().needs_reference and JensUn(retain_loss_type="kl").needs_reference
    assert not JensUn(retain_loss_type="nll").needs_reference
    with pytest.raises(RuntimeError, match="prepare"):
        JensUn().loss(_tiny_llama(layers=2), _inputs(), None)


# --------------------------------------------------------------------------- JensUn


def test_jensun_loss_is_jensun_forget_loss_plus_a_zero_retain_jsd():
    model = _tiny_llama(layers=2)
    inputs = _inputs()
    for legacy in (False, True):
        method = JensUn(refusal_ids=(5, 9), legacy_unmasked=legacy)
        loss, logs = method.loss(model, inputs, copy.deepcopy(model))
        batch = inputs["forget"]
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        expected = jensun_forget_loss(logits, batch["labels"], [5, 9], legacy_unmasked=legacy)
        assert logs["forget_loss"] == pytest.approx(float(expected), rel=1e-5)
        assert logs["retain_loss"] == pytest.approx(0.0, abs=1e-6)
        assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5, abs=1e-6)


def test_jensun_prepare_tokenizes_the_refusal():
    from lacuna_unlearn.testbed.tokenizer import train_tokenizer

    tok = train_tokenizer(["Q: Who? A: No idea.", "I have no idea what you mean", "No, no idea"] * 5, vocab_size=300)
    method = JensUn()
    method.prepare(tok)
    assert list(method.refusal_ids) == tok(" No idea", add_special_tokens=False)["input_ids"]
    assert tok.decode(list(method.refusal_ids)) == " No idea"
    fixed = JensUn(refusal_ids=[3, 4])
    fixed.prepare(tok)
    assert fixed.refusal_ids == (3, 4)  # explicit ids win
