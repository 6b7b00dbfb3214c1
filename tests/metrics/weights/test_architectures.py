"""The architecture matrix: tiny random models (built from transformers configs, no downloads) of every decoder-only
family the issue names, each run through the model anatomy, ``lacuna score`` (FRAG coverage, distances, and
localization with masks built by ``lacuna_metrics.masks`` for that model), selective pruning and AlphaEdit. One model
per architecture is shared by all checks (module-scoped fixtures; inputs in tests/helpers/architectures.py); the CLI
runs in-process (``lacuna_unlearn.bench.cli.main.main``). ``lacuna-unlearn`` (restricted, LoRA) and the task pack on
the same models: tests/e2e/test_architectures_unlearn_eval.py. See docs/anatomy.md.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.architectures import (
    _SPECIAL,
    ARCHITECTURES,
    LAYERS,
    VOCAB,
    Arch,
    World,
    _configs,
    _unlearn,
    make_arch,
    make_world,
)
from safetensors.torch import load_file, save_file

from lacuna_metrics.masks import component, load_masks
from lacuna_metrics.weights.anatomy import PROJECTION_WEIGHT_PATTERN, checkpoint_anatomy, classify_name, model_anatomy
from lacuna_metrics.weights.checkpoints import Checkpoint


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    """A small LACUNA dataset and a byte-level BPE tokenizer trained on it (seconds, no network)."""
    return make_world(tmp_path_factory.mktemp("architectures"))


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch(request, world) -> Arch:
    """One tiny random model of the architecture, saved with the tokenizer, and masks built for it."""
    return make_arch(request.param, world)


#: Projection weight matrices per block of the loaded model, by component (model_anatomy).
EXPECTED_MODEL = {
    "llama": {"attention": 4, "mlp": 3},
    "mistral": {"attention": 4, "mlp": 3},
    "qwen2": {"attention": 4, "mlp": 3},
    "gemma2": {"attention": 4, "mlp": 3},
    "phi3": {"attention": 2, "mlp": 2},  # fused qkv_proj, o_proj; fused gate_up_proj, down_proj
    "mixtral": {"attention": 4, "router": 1, "expert": 2},  # transformers 5: fused 3-D gate_up_proj / down_proj
    "olmo2": {"attention": 4, "mlp": 3},
    "gpt2": {"attention": 2, "mlp": 2},  # Conv1D c_attn, c_proj; c_fc, c_proj
    "gpt_neox": {"attention": 2, "mlp": 2},
    "opt": {"attention": 4, "mlp": 2},  # q/k/v/out_proj; fc1, fc2 directly in the block
    "falcon": {"attention": 2, "mlp": 2},
    "bloom": {"attention": 2, "mlp": 2},
    "qwen2_moe": {"attention": 4, "router": 2, "expert": 2, "mlp": 3},  # + shared expert and its gate
}
#: Weights stored (d_in, d_out) per block.
EXPECTED_TRANSPOSED = {"gpt2": 4}


def _noisy_copy(
    src: Path, dest: Path, scale: float, only: dict[str, torch.Tensor] | None = None, seed: int = 0
) -> Path:
    """A copy of checkpoint ``src`` with seeded noise on every floating tensor (or only where ``only`` is True)."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    state = load_file(str(src / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32) * scale
        if only is not None:
            noise = noise * only[name].reshape(t.shape) if name in only else torch.zeros_like(noise)
        out[name] = (t.float() + noise).to(t.dtype)
    save_file(out, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _score(world: World, arch: Arch, out: Path, after: Path, *args: str) -> dict[str, Any]:
    from lacuna_unlearn.bench.cli.main import main

    code = main(
        [
            "score", "--before", str(arch.before), "--after", str(after), "--out", str(out),
            "--calib-forget", str(world.data_dir), "--calib-retain", str(world.data_dir), "--calib-samples", "4",
            "--activation-cache", str(world.cache), "--quiet", "--composite-samples", "0", *args,
        ]
    )  # fmt: skip
    assert code == 0, f"lacuna score exited {code}"
    return json.loads((out / "score.json").read_text())


# -- anatomy -------------------------------------------------------------------------------------------------------


def test_anatomy_classifies_every_block_projection(arch):
    anatomy = model_anatomy(arch.model)
    counts = anatomy.counts()
    assert counts["layers"] == list(range(LAYERS)) and anatomy.num_layers == LAYERS
    expected = EXPECTED_MODEL[arch.name]
    assert counts["components"] == {c: n * LAYERS for c, n in expected.items()}
    for layer in range(LAYERS):
        for comp, n in expected.items():
            assert counts["per_layer"][f"{layer}/{comp}"] == n
    assert sum(w.transposed for w in anatomy.matrices()) == EXPECTED_TRANSPOSED.get(arch.name, 0) * LAYERS
    # every block tensor with an input axis is a classified projection; what is left are norms (1-D)
    biases = {n for n, w in anatomy.weights.items() if w.kind == "bias"}
    assert all(len(s) == 1 for n, s in anatomy.block_tensors.items() if n not in anatomy.weights), arch.name
    assert set(anatomy.block_matrix_names()) == {w.name for w in anatomy.matrices()}
    assert biases.isdisjoint(anatomy.block_matrix_names())

    # the checkpoint's view (names + config.json) agrees, and the masks' name rules with it
    ckpt = Checkpoint(arch.before)
    disk = checkpoint_anatomy({n: ckpt.shape(n) for n in ckpt.names}, ckpt.config(), str(arch.before))
    assert set(disk.block_matrix_names()) == {w.name for w in disk.matrices()}  # nothing unrecognised on disk
    shared = {n for n in disk.weights if n in anatomy.weights}
    for n in shared:
        m, d = anatomy.weights[n], disk.weights[n]
        assert (m.layer, m.component, m.role, m.kind, m.transposed) == (
            d.layer,
            d.component,
            d.role,
            d.kind,
            d.transposed,
        )
    for n, w in disk.weights.items():
        eligible = w.kind == "weight" and not w.fused_experts and w.component in ("attention", "mlp", "expert")
        assert bool(re.search(PROJECTION_WEIGHT_PATTERN, n)) == eligible, n
        assert component(n) == w.component == classify_name(n).component
    if arch.name == "mixtral":  # transformers 5 saves the fused experts per expert: 4 experts x w1/w2/w3
        assert disk.counts()["components"]["expert"] == 4 * 3 * LAYERS


# -- lacuna score --------------------------------------------------------------------------------------------------


def test_score_frag_covers_the_block_weights(world, arch):
    after = _noisy_copy(arch.before, world.root / arch.name / "after_noise", 1e-2)
    result = _score(world, arch, world.root / arch.name / "score_nomasks", after, "--no-masks")
    frag = result["frag"]
    coverage = frag["coverage"]
    assert coverage["share"] >= 0.9 and not coverage["below_threshold"] and coverage["warning"] is None
    assert coverage["share"] == pytest.approx(1.0), coverage["skipped"]
    assert coverage["block_modules"] == coverage["block_weights"] == frag["modules"]
    assert math.isfinite(frag["frag"]) and 0.0 < frag["forget_alignment"] <= 1.0
    assert result["distance"]["l2"] > 0 and result["auc"] is None


def test_score_localizes_with_masks_built_for_the_model(world, arch):
    masks = load_masks(arch.masks)
    before = load_file(str(arch.before / "model.safetensors"))
    forget = {n: masks.forget_mask(n) for n in masks.packed}
    assert set(forget) <= set(before)  # mask names are checkpoint names
    after = _noisy_copy(arch.before, world.root / arch.name / "after_planted", 1e-2, only=forget, seed=1)
    result = _score(world, arch, world.root / arch.name / "score_masks", after, "--masks", str(arch.masks))
    assert result["auc"]["forget"]["raw"] > 0.99  # the planted update touches forget scalars only
    assert {row["component"] for row in result["per_layer"]} <= {"attention", "mlp", "expert"}
    assert result["frag"]["coverage"]["share"] >= 0.9 and result["frag"]["activation_cache_hit"]


#: Architectures whose MLPs are only fused 3-D expert tensors: Selective Pruning has no neuron to remove there.
NO_PRUNABLE_MLP = {"mixtral"}


def test_selective_pruning_removes_exactly_the_chosen_neurons(arch):
    """SP finds every MLP through the anatomy, on every layout (Linear, GPT-2 Conv1D, Phi-3's fused gate_up, OPT's
    bare fc1/fc2, biases): the pruned model computes what the original computes with the chosen neurons' values
    zeroed at the output projection's input (an independent reference: a hook, no weight layout involved), and in
    ``neuron`` mode those values are already zero (the producing channels and biases are zeroed too)."""
    from lacuna_unlearn.methods.selective_pruning import SPConfig, apply_selective_pruning, mlp_neurons

    if arch.name in NO_PRUNABLE_MLP:
        with pytest.raises(ValueError, match="found no MLP output projection"):
            mlp_neurons(arch.model)
        return
    gen = torch.Generator().manual_seed(1)
    original = copy.deepcopy(arch.model)
    with torch.no_grad():  # a fresh model's biases are zero: give them values, so zeroing them is checked
        for name, param in original.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen))
    mlps = mlp_neurons(original)
    assert len(mlps) == LAYERS  # one per block (Qwen2-MoE: its shared expert; the routed experts are fused)
    x_forget = {n: torch.rand(m["d_mlp"], generator=gen) for n, m in mlps.items()}
    x_retain = {n: torch.ones(m["d_mlp"]) for n, m in mlps.items()}
    ids = torch.randint(3, VOCAB, (2, 12), generator=gen)
    for mode in ("neuron", "down"):
        pruned = copy.deepcopy(original)
        stats = apply_selective_pruning(pruned, x_forget, x_retain, SPConfig(frac=0.25, mode=mode))
        chosen = {n: torch.tensor(v, dtype=torch.long) for n, v in stats["neurons"].items()}
        assert stats["pruned_total"] == sum(map(len, chosen.values())) > 0
        inputs: dict[str, torch.Tensor] = {}
        want = _logits_with_mlp_inputs(original, ids, mlps, chosen, zero=True)
        got = _logits_with_mlp_inputs(pruned, ids, mlps, chosen, zero=False, seen=inputs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"{arch.name} mode={mode}")
        if mode == "neuron":
            assert all(torch.count_nonzero(v) == 0 for v in inputs.values()), arch.name
        after = dict(pruned.named_parameters())
        changed = {n for n, v in original.named_parameters() if not torch.equal(v, after[n])}
        assert changed and changed <= set(stats["zeroed"]), arch.name
        assert (len(set(stats["zeroed"])) > len(chosen)) == (mode == "neuron")


def test_alpha_edit_finds_and_edits_the_mlp_output_projection(world, arch):
    """AlphaEdit's ``module``/``block`` = ``auto`` come from the anatomy on every architecture (a ``Conv1D`` on
    GPT-2, Qwen2-MoE's shared expert); the closed-form edit runs and moves every edited layer's weight."""
    from lacuna_tasks.loader import load_data
    from lacuna_tasks.prompts import qa_text
    from lacuna_unlearn.methods.alpha_edit.edit import (
        AlphaEditConfig,
        apply_alpha_edit,
        edit_requests,
        key_second_moments,
    )
    from lacuna_unlearn.methods.alpha_edit.keys import edited_module, with_templates

    cfg = AlphaEditConfig(
        layers=list(range(LAYERS)), fact_token="last", v_num_grad_steps=3, batch_size=1, kl_factor=0.0625,
        nullspace_threshold=0.1, nullspace_relative=True, clamp_norm_factor=1e4, v_weight_decay=0.0,
    )  # fmt: skip
    if arch.name in NO_PRUNABLE_MLP:
        with pytest.raises(ValueError, match="module=auto found no MLP output projection"):
            with_templates(arch.model, cfg)
        return
    model = copy.deepcopy(arch.model)
    resolved = with_templates(model, cfg)
    outputs = {
        w.module for w in model_anatomy(model).matrices() if w.component == "mlp" and w.role in ("down", "fc_out")
    }
    assert {resolved.module.format(layer) for layer in cfg.layers} == outputs
    data = load_data(world.data_dir).splits
    preserved = [qa_text(r["question"], r["answer"]) for r in data["retain"][:1]]
    before = {layer: edited_module(model, resolved.module, layer).weight.detach().clone() for layer in cfg.layers}
    stats = apply_alpha_edit(
        model, world.tokenizer, edit_requests(data["forget"][:2], cfg.target), cfg,
        key_second_moments(model, world.tokenizer, preserved, cfg),
    )  # fmt: skip
    for layer in cfg.layers:
        after = edited_module(model, resolved.module, layer).weight
        assert not torch.equal(after, before[layer]) and stats["layers"][str(layer)]["update_fro"] > 0, arch.name


def _logits_with_mlp_inputs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mlps: dict[str, Any],
    chosen: dict[str, torch.Tensor],
    *,
    zero: bool,
    seen: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``model``'s logits with a pre-hook on every MLP output projection that zeroes the ``chosen`` input channels
    (``zero``) or records their values into ``seen``."""

    def hook(name: str):
        def pre_hook(_module, args):
            if seen is not None:
                seen[name] = args[0][..., chosen[name]].detach().clone()
            if zero:
                x = args[0].clone()
                x[..., chosen[name]] = 0.0
                return (x,)
            return None

        return pre_hook

    handles = [model.get_submodule(m["down"].name).register_forward_pre_hook(hook(n)) for n, m in mlps.items()]
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        for handle in handles:
            handle.remove()


# -- fused experts -------------------------------------------------------------------------------------------------


def _tiny(world: World, name: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(name, vocab_size=VOCAB, **_SPECIAL, **_configs()[name])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_fused_expert_norms_match_an_eager_reference(world, name, monkeypatch):
    """Per expert, x of gate_up_proj / down_proj equals the inputs transformers' own eager loop feeds each expert."""
    from lacuna_metrics.frag.activations import calibration_texts, collect_input_norms

    model = _tiny(world, name)
    texts = calibration_texts(world.data_dir, "forget", 3)
    got = collect_input_norms(model, world.tokenizer, texts, max_length=64, dtype=torch.float32)

    experts = {n: p for n, p in model.named_parameters() if n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    assert experts and all(n in got and got[n].shape == (p.shape[0], p.shape[2]) for n, p in experts.items())
    per_seq: dict[tuple[str, int], torch.Tensor] = {}
    real_linear = torch.nn.functional.linear
    calls = []

    def spy(x, weight, bias=None):
        for n, p in experts.items():
            for e in range(p.shape[0]):
                if weight.data_ptr() == p[e].data_ptr() and weight.shape == p[e].shape:
                    calls.append((n, e))
                    sq = x.detach().double().pow(2).sum(dim=0)
                    per_seq[n, e] = per_seq.get((n, e), 0) + sq
        return real_linear(x, weight, bias)

    model.set_experts_implementation("eager")
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    want = {n: torch.zeros(p.shape[0], p.shape[2], dtype=torch.float64) for n, p in experts.items()}
    with torch.no_grad():
        for text in texts:
            per_seq.clear()
            enc = world.tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            for (n, e), sq in per_seq.items():
                want[n][e] += sq.sqrt()
    monkeypatch.undo()
    assert len({e for _, e in calls}) > 1  # the eager loop ran through the spied linear, for several experts
    for n, w in want.items():
        torch.testing.assert_close(got[n].double(), w / len(texts), rtol=1e-5, atol=1e-6, msg=n)


def test_frag_on_fused_experts_equals_frag_on_their_slices():
    """A fused [E, out, in] tensor (or [E, in, out]) with x [E, in] scores exactly as its E matrices side by side,
    whatever the expert blocks it is fed in."""
    from lacuna_metrics.frag.alignment import FragAccumulator

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, 5, generator=gen)
    u = w + 0.1 * torch.randn(4, 6, 5, generator=gen) * (torch.rand(4, 6, 5, generator=gen) > 0.5)
    xf, xr = torch.rand(4, 5, generator=gen), torch.rand(4, 5, generator=gen)
    sliced = FragAccumulator(
        {f"e{e}": xf[e] for e in range(4)} | {"t": xf[0]}, {f"e{e}": xr[e] for e in range(4)} | {"t": xr[0]}
    )
    for e in range(4):
        sliced.add(f"e{e}", w[e], u[e])
    sliced.add("t", w[0], u[0])
    want = sliced.result()
    for transposed in (False, True):
        fused = FragAccumulator(
            {"f": xf, "t": xf[0]}, {"f": xr, "t": xr[0]}, conv1d_transposed=["f"] if transposed else []
        )
        wf, uf = (w.transpose(1, 2), u.transpose(1, 2)) if transposed else (w, u)
        fused.check_shape("f", tuple(wf.shape))
        fused.add("f", wf[:1], uf[:1])
        fused.add("f", wf[1:], uf[1:])
        fused.add("t", w[0], u[0])
        got = fused.result()
        for key in ("forget_alignment", "retain_alignment", "frag"):
            assert got[key] == pytest.approx(want[key], rel=1e-12)
        assert fused.rows_seen["f"] == 4
    with pytest.raises(ValueError, match="3 experts, an input axis of 5"):
        FragAccumulator({"f": xf[:3]}, {"f": xr[:3]}).check_shape("f", (4, 6, 5))


def test_checkpoint_names_take_the_fused_experts_vectors(world):
    """transformers 5 saves Mixtral's fused experts as block_sparse_moe.experts.E.w1/w2/w3: each gets row E of the
    fused parameter's vector (w1, w3: gate_up_proj's input; w2: down_proj's)."""
    from lacuna_metrics.frag.activations import activation_stats, calibration_texts, collect_input_norms

    model = _tiny(world, "mixtral")
    path = world.root / "mixtral_names"
    model.save_pretrained(path)
    world.tokenizer.save_pretrained(path)
    texts = calibration_texts(world.data_dir, "forget", 3)
    stats = activation_stats(path, texts, texts, dtype=torch.float32, max_length=64)
    direct = collect_input_norms(model, world.tokenizer, texts, max_length=64, dtype=torch.float32)
    assert set(stats.forget) == set(Checkpoint(path).names) & set(stats.forget)
    for layer in range(LAYERS):
        fused = f"model.layers.{layer}.mlp.experts."
        for e in range(4):
            disk = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
            for leaf, source in (("w1", "gate_up_proj"), ("w3", "gate_up_proj"), ("w2", "down_proj")):
                torch.testing.assert_close(stats.forget[f"{disk}{leaf}.weight"], direct[fused + source][e])
        router = f"model.layers.{layer}.block_sparse_moe.gate.weight"
        torch.testing.assert_close(stats.forget[router], direct[f"model.layers.{layer}.mlp.gate.weight"])
    assert stats.coverage["share"] == 1.0 and stats.coverage["by_component"]["expert"]["scored_tensors"] == 24


# -- coverage report and bad input --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(world) -> Path:
    path = world.root / "llama_cli" / "before"
    model = _tiny(world, "llama")
    model.save_pretrained(path)
    world.tokenizer.save_pretrained(path)
    return path


def _cli(world: World, before: Path, out: Path, *args: str) -> int:
    from lacuna_unlearn.bench.cli.main import main

    return main(
        [
            "score", "--before", str(before), "--after", str(before), "--out", str(out), "--no-masks",
            "--calib-forget", str(world.data_dir), "--calib-retain", str(world.data_dir), "--calib-samples", "2",
            "--activation-cache", str(world.cache), "--quiet", *args,
        ]
    )  # fmt: skip


def test_low_coverage_is_reported(world, llama, capsys):
    out = world.root / "llama_cli" / "attention_only"
    assert _cli(world, llama, out, "--frag-target", "attention") == 0
    coverage = json.loads((out / "score.json").read_text())["frag"]["coverage"]
    assert coverage["below_threshold"] and coverage["threshold"] == 0.9
    assert coverage["share"] == pytest.approx(1 / 3) and coverage["modules"] == 8
    assert coverage["skipped"]["outside target 'attention'"]["tensors"] == 6
    printed = capsys.readouterr().out
    assert "warning: FRAG covers only 33.3% of the block weights (8 of 14 tensors" in printed
    lenient = world.root / "llama_cli" / "attention_lenient"
    assert _cli(world, llama, lenient, "--frag-target", "attention", "--frag-min-coverage", "0.3") == 0
    coverage = json.loads((lenient / "score.json").read_text())["frag"]["coverage"]
    assert not coverage["below_threshold"] and coverage["threshold"] == 0.3
    assert "warning: FRAG covers" not in capsys.readouterr().out


def _edit_config(src: Path, dest: Path, drop: tuple[str, ...] = (), **changes: Any) -> Path:
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    for key in drop:
        cfg.pop(key)
    cfg.update(changes)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_bad_inputs_fail_in_one_line_without_a_score(world, llama, capsys):
    root = world.root / "llama_cli"
    no_layers = _edit_config(llama, root / "no_layers", drop=("num_hidden_layers",))
    no_blocks = root / "no_blocks"
    shutil.copytree(llama, no_blocks)
    state = load_file(str(llama / "model.safetensors"))
    renamed = {n.replace("model.layers.", "model.stack_"): t for n, t in state.items()}
    save_file(renamed, str(no_blocks / "model.safetensors"), metadata={"format": "pt"})
    cases = [
        (no_layers, (), f"{no_layers}: config has no usable num_hidden_layers (missing"),
        (no_blocks, (), f"{no_blocks}: no transformer blocks recognised"),
        (llama, ("--frag-target", "regex:nothing_here"), "--frag-target 'regex:nothing_here' matches none"),
        (llama, ("--frag-target", "attn"), "unknown target 'attn'"),
    ]
    for i, (before, args, message) in enumerate(cases):
        out = root / f"bad{i}"
        assert _cli(world, before, out, *args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not (out / "score.json").exists()


def test_fused_and_per_expert_checkpoints_score_the_same_frag(world):
    """The same Mixtral pair saved per expert (transformers 5 save_pretrained) and with the experts fused (3-D
    tensors on disk): both are fully covered and give the same FRAG."""
    from lacuna_metrics.frag.activations import activation_stats, calibration_texts
    from lacuna_metrics.frag.alignment import frag_score

    model = _tiny(world, "mixtral")
    gen = torch.Generator().manual_seed(2)
    after_model = _tiny(world, "mixtral")
    with torch.no_grad():
        for p in after_model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-2 * (torch.rand(p.shape, generator=gen) < 0.3))
    root = world.root / "mixtral_layouts"
    paths = {}
    for label, m in (("before", model), ("after", after_model)):
        per_expert = root / "per_expert" / label
        m.save_pretrained(per_expert)
        world.tokenizer.save_pretrained(per_expert)
        fused = root / "fused" / label
        shutil.copytree(per_expert, fused, ignore=shutil.ignore_patterns("*.safetensors"))
        state = {n: t.detach().clone().contiguous() for n, t in m.state_dict().items()}
        save_file(state, str(fused / "model.safetensors"), metadata={"format": "pt"})
        paths[label] = (per_expert, fused)
    texts = calibration_texts(world.data_dir, "forget", 3)
    retain = calibration_texts(world.data_dir, "retain", 3)
    results = []
    for layout in (0, 1):
        stats = activation_stats(paths["before"][layout], texts, retain, dtype=torch.float32, max_length=64)
        assert stats.coverage["share"] == 1.0
        results.append(frag_score(Checkpoint(paths["before"][layout]), Checkpoint(paths["after"][layout]), stats))
    per_expert, fused = results
    assert fused["modules"] == 2 * (4 + 1 + 2) and per_expert["modules"] == 2 * (4 + 1 + 4 * 3)
    for key in ("forget_alignment", "retain_alignment", "frag"):
        assert fused[key] == pytest.approx(per_expert[key], rel=1e-9, abs=1e-12)
    assert fused["coverage"]["share"] == per_expert["coverage"]["share"] == 1.0


def test_tokenizer_without_eos_or_pad_is_refused_before_the_model_loads(world, llama, tmp_path):
    """lacuna-unlearn pads its batches with the pad token (EOS if none): a tokenizer with neither is a one-line
    error naming the checkpoint, and nothing is written. lacuna score reads no special token (FRAG tokenizes each
    calibration text alone, unpadded), so it scores such a checkpoint."""
    from lacuna_unlearn.bench.cli.main import main as lacuna_main

    bare = tmp_path / "bare"
    shutil.copytree(llama, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.update(eos_token=None, pad_token=None, bos_token=None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    for name in ("special_tokens_map.json",):
        (bare / name).unlink(missing_ok=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bare)
    assert tok.eos_token_id is None and tok.pad_token_id is None
    out = tmp_path / "unlearned"
    with pytest.raises(ValueError, match=f"{bare}: the tokenizer has neither an EOS nor a pad token"):
        _unlearn(world, Arch("llama", None, bare, bare), out, "method=grad_diff")  # type: ignore[arg-type]
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    code = lacuna_main(
        [
            "score", "--before", str(bare), "--after", str(bare), "--out", str(tmp_path / "score"), "--no-masks",
            "--calib-forget", str(world.data_dir), "--calib-retain", str(world.data_dir), "--calib-samples", "2",
            "--activation-cache", str(world.cache), "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
