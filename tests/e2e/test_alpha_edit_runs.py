"""AlphaEdit on real models: subject tokens and BOS on the tiny memorizing model's tokenizer, preserved keys on a
real 2-layer model, the job (checkpoint, manifest, cache), its errors, and the Hydra entry point on the smoke testbed
(the closed form against hand-built references: tests/unlearn/methods/test_methods_alpha_edit.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lacuna_unlearn.methods.alpha_edit.edit import (
    AlphaEditConfig,
    EditRequest,
    apply_alpha_edit,
    edit_requests,
    key_second_moments,
    run_alpha_edit,
    subject_last_token,
)


def test_subject_last_token_uses_offsets(tiny_lacuna) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    text = "Q: Ann Lee, who lives in Paris. What is her Email Address?\nA:"
    idx = subject_last_token(tok, text, "Ann Lee")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[: idx + 1]).endswith("Lee")
    with pytest.raises(ValueError, match="does not occur"):
        subject_last_token(tok, text, "Bob Smith")


def test_prompts_start_with_the_bos_the_tokenizer_adds(tiny_lacuna) -> None:
    """As MEMIT/AlphaEdit's code and lm-eval tokenize: a tokenizer that puts a BOS before every text (Llama, Mistral)
    gets it before each prompt, and the lookup indices count it."""
    import copy

    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from lacuna_unlearn.methods.alpha_edit.edit import encode, lookup_token

    plain_tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    backend = copy.deepcopy(plain_tok.backend_tokenizer)
    bos = plain_tok.eos_token_id  # standing in for a BOS
    backend.post_processor = processors.TemplateProcessing(
        single=f"{plain_tok.eos_token} $A", special_tokens=[(plain_tok.eos_token, bos)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=plain_tok.eos_token)
    text = "Q: Ann Lee, who lives in Paris. What is her Email Address?\nA:"
    plain = plain_tok(text, add_special_tokens=False)["input_ids"]
    assert encode(plain_tok, text) == plain and encode(tok, text) == [bos, *plain]
    idx = subject_last_token(tok, text, "Ann Lee")
    assert idx == subject_last_token(plain_tok, text, "Ann Lee") + 1
    assert tok.decode(encode(tok, text)[1 : idx + 1]).endswith("Lee")
    assert lookup_token(tok, text, "Ann Lee", "last") == len(plain)


def _tiny(tiny_lacuna):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_lacuna.model_dir).eval()
    return model, tok


def _target_nll(model, tok, request: EditRequest) -> float:
    prompt = tok(request.prompt, add_special_tokens=False)["input_ids"]
    target = tok(f" {request.target}\n", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + target])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :]))


def _tiny_gpt2(tiny_lacuna):
    """A random 2-layer GPT-2 (transformers ``Conv1D`` projections, stored d_in x d_out) with the tiny tokenizer."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tiny_lacuna.model_dir)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=2, n_positions=256)
    return GPT2LMHeadModel(config).eval(), tok


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_edit_on_a_two_layer_model_keeps_preserved_outputs_and_installs_the_target(tiny_lacuna, tiny_email_rows, arch):
    """The issue's toy: a real 2-layer Llama (intermediate size 128), and a GPT-2 whose MLP output projection is a
    ``Conv1D`` (the update is added transposed); ``module``/``block`` are ``auto`` (the model anatomy). The
    preserved text has fewer tokens than keys have dimensions, so its keys span a proper subspace; the edit must
    not change the edited module's output on any of them (to 1e-5), while the refusal becomes more likely."""
    from lacuna_metrics.weights.anatomy import is_transposed_module
    from lacuna_tasks.prompts import qa_text
    from lacuna_unlearn.methods.alpha_edit.keys import edited_module, with_templates

    model, tok = _tiny(tiny_lacuna) if arch == "llama" else _tiny_gpt2(tiny_lacuna)
    forget, retain = tiny_email_rows
    preserved = [qa_text(r["question"], r["answer"]) for r in retain[:1]]
    # threshold far below every non-zero eigenvalue: P is exactly the complement of the preserved keys' span
    # (the default 1e-3 also counts low-variance preserved directions as free, by design). The tiny model's
    # residual norm is ~0.01, so MEMIT's decay ||δ||/||h||² and clamp 0.5·||h|| would pin δ at zero: off here.
    # With two layers, a value at the subject token of the last layer reaches no later position: read keys and
    # values at the prompt's last token.
    cfg = AlphaEditConfig(
        layers=[0, 1],
        fact_token="last",
        v_num_grad_steps=25,
        kl_factor=0.0625,
        batch_size=1,
        nullspace_threshold=1e-9,
        clamp_norm_factor=1e4,
        v_weight_decay=0.0,
    )
    resolved = with_templates(model, cfg)
    want = "model.layers.{}.mlp.down_proj" if arch == "llama" else "transformer.h.{}.mlp.c_proj"
    assert (resolved.module, resolved.block) == (want, want.split(".{}.")[0] + ".{}")
    edited = {layer: edited_module(model, resolved.module, layer) for layer in cfg.layers}
    assert all(is_transposed_module(m) == (arch == "gpt2") for m in edited.values())

    def matrix(layer: int) -> torch.Tensor:  # d_out x d_in, however the module stores it
        weight = edited[layer].weight.detach()
        return (weight.T if is_transposed_module(edited[layer]) else weight).double().clone()

    moments = key_second_moments(model, tok, preserved, cfg)
    keys = {}
    for layer in cfg.layers:  # the preserved keys themselves, recorded before the edit
        seen = []
        h = edited[layer].register_forward_pre_hook(lambda _m, a, seen=seen: seen.append(a[0][0]))
        with torch.no_grad():
            model(input_ids=torch.tensor([tok(preserved[0], add_special_tokens=False)["input_ids"]]))
        h.remove()
        keys[layer] = seen[0].T.double()  # d_in x tokens
        assert keys[layer].shape[1] < keys[layer].shape[0]
    weights = {layer: matrix(layer) for layer in cfg.layers}
    requests = edit_requests(forget, cfg.target)
    before = [_target_nll(model, tok, r) for r in requests]
    stats = apply_alpha_edit(model, tok, requests, cfg, moments)
    after = [_target_nll(model, tok, r) for r in requests]
    for layer in cfg.layers:
        delta = matrix(layer) - weights[layer]
        assert float(delta.norm()) > 1e-3  # the layer was edited ...
        scale = float((weights[layer] @ keys[layer]).abs().max())
        assert float((delta @ keys[layer]).abs().max()) <= 1e-5 * max(scale, 1.0)  # ... not on preserved keys
        assert stats["layers"][str(layer)]["null_space_dim"] > 0
    # the refusal's tokens are foreign to the trained model: its NLL falls (by > 0.5 nats per token), it does not
    # vanish; the random GPT-2 only needs to move towards it
    drop = 0.5 if arch == "llama" else 0.0
    assert all(a < b - drop for a, b in zip(after, before, strict=True)), (before, after)
    assert all(r > 0.1 for r in stats["reached"])


def test_run_writes_checkpoint_manifest_and_reuses_the_cached_moments(tiny_lacuna, tiny_email_rows, tmp_path):
    from transformers import AutoModelForCausalLM

    forget, retain = tiny_email_rows
    cfg = AlphaEditConfig(layers=[0], v_num_grad_steps=5, nullspace_threshold=1e-2)
    texts = [f"{r['question']} {r['answer']}" for r in retain]
    cache = tmp_path / "cache"
    out = run_alpha_edit(
        tiny_lacuna.model_dir, edit_requests(forget, cfg.target), texts, tmp_path / "a", cfg, cache_dir=cache
    )
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["method"] == "alpha_edit" and manifest["requests"] == len(forget)
    assert manifest["second_moments_cached"] is False and manifest["method_args"]["layers"] == [0]
    assert not (tmp_path / "a.partial").exists() and len(list(cache.iterdir())) == 1
    AutoModelForCausalLM.from_pretrained(out)  # a plain HF checkpoint
    again = run_alpha_edit(
        tiny_lacuna.model_dir, edit_requests(forget, cfg.target), texts, tmp_path / "b", cfg, cache_dir=cache
    )
    assert json.loads((again / "unlearn_manifest.json").read_text())["second_moments_cached"] is True


def test_errors_name_the_field_the_module_and_the_threshold(tiny_lacuna, tiny_email_rows, tmp_path) -> None:
    forget, retain = tiny_email_rows
    with pytest.raises(ValueError, match="AlphaEditConfig.layers"):
        AlphaEditConfig(layers=[]).validate()
    with pytest.raises(ValueError, match="AlphaEditConfig.cov_text"):
        AlphaEditConfig(cov_text=["wikipedia"]).validate()
    with pytest.raises(ValueError, match="model.layers.7.mlp.down_proj"):
        run_alpha_edit(
            tiny_lacuna.model_dir, edit_requests(forget, "x"), ["a b"], tmp_path / "o", AlphaEditConfig(layers=[7])
        )
    model, tok = _tiny(tiny_lacuna)
    cfg = AlphaEditConfig(layers=[0], nullspace_threshold=0.0)
    moments = {0: torch.eye(128, dtype=torch.float64)}
    with pytest.raises(ValueError, match="nullspace_threshold"):
        apply_alpha_edit(model, tok, edit_requests(forget, cfg.target), cfg, moments)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def _cli(*args: str):
    return subprocess.run(
        [sys.executable, "-m", "lacuna_unlearn.trainer.app", *args], capture_output=True, text=True, timeout=600
    )


def test_hydra_method_alpha_edit_on_the_smoke_testbed(smoke_testbed, forget_nll, tmp_path) -> None:
    from lacuna_tasks.loader import load_data
    from lacuna_unlearn.qa.unlearn_data import split_rows

    out = tmp_path / "ae"
    done = _cli(
        "experiment=mini/alpha_edit", f"testbed={smoke_testbed}", "field=email", f"output_dir={out}",
        "method.args.v_num_grad_steps=40",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "unlearn_manifest.json").read_text())
    assert manifest["preserved_sources"]["retain"] > 0 and manifest["preserved_sources"]["neutral"] > 0
    forget = split_rows(load_data(smoke_testbed), "forget", "email")
    assert forget_nll(out, forget) > forget_nll(smoke_testbed / "model", forget)
    refused = _cli(
        "method=alpha_edit", f"testbed={smoke_testbed}", f"output_dir={tmp_path / 'r'}", "restrict=forget_mask"
    )
    assert refused.returncode == 2 and "restrict do not apply" in refused.stderr
    absolute = _cli(
        "method=alpha_edit", f"testbed={smoke_testbed}", f"output_dir={tmp_path / 'a'}", "method.args.layers=[0]"
    )
    assert absolute.returncode == 2 and "nullspace_threshold" in absolute.stderr  # smoke keys: eigenvalues >> 1e-3
    bad = _cli(
        "method=alpha_edit",
        f"testbed={smoke_testbed}",
        f"output_dir={tmp_path / 'b'}",
        "method.args.layers=[0]",
        "+method.args.nope=1",
    )
    assert bad.returncode == 2 and "nope" in bad.stderr
