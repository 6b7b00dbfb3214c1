"""WAGLE (weight-attribution masks + GradDiff/NPO) and Selective Pruning (neuron forget/retain activation ratio).

Closed forms on hand-made tensors (attribution score, top-k with ties, SP scores with eps, exact zeroing). The
trainer contract on the tiny memorizing model, the Hydra app and both methods on the smoke testbed:
tests/e2e/test_wagle_sp_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from lacuna_unlearn.methods import make_method
from lacuna_unlearn.methods.selective_pruning import (
    SPConfig,
    apply_selective_pruning,
    mlp_neurons,
    sp_prune_masks,
    sp_scores,
)
from lacuna_unlearn.methods.wagle import attribution_scores, top_fraction_masks


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=6,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config).eval()


# -- WAGLE: pure functions -------------------------------------------------------------------------------------


def test_attribution_score_closed_form() -> None:
    w = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    g_f = torch.tensor([[2.0, 1.0], [-1.0, 4.0]])
    g_r = torch.tensor([[1.0, 0.0], [-0.5, 1.0]])
    # S = |(w - g_r / mu) * g_f| with mu = 0.5:
    # [[|(1 - 2) * 2|, |(-2 - 0) * 1|], [|(0.5 + 1) * -1|, |(0 - 2) * 4|]] = [[2, 2], [1.5, 8]]
    assert attribution_scores(w, g_f, g_r, 0.5).tolist() == [[2.0, 2.0], [1.5, 8.0]]
    # mu -> infinity: the SNIP score |w * g_f|; a tiny mu: |g_r * g_f| / mu dominates
    assert torch.allclose(attribution_scores(w, g_f, g_r, 1e12), (w * g_f).abs())
    assert torch.allclose(attribution_scores(w, g_f, g_r, 1e-6) * 1e-6, (g_r * g_f).abs(), atol=1e-5)
    with pytest.raises(ValueError, match="mu"):
        attribution_scores(w, g_f, g_r, 0.0)
    with pytest.raises(ValueError, match="grad_retain"):
        attribution_scores(w, g_f, g_r[:1], 1.0)
    with pytest.raises(ValueError, match="not finite"):
        attribution_scores(w, g_f * float("nan"), g_r, 1.0)


def test_top_fraction_ties_by_hand() -> None:
    scores = {"a": torch.tensor([3.0, 1.0, 3.0]), "b": torch.tensor([[3.0, 0.0]])}
    # global, N = 5: k = int(0.4 * 5) = 2 of the three tied 3s -> the first two in (tensor order, index) order
    got = top_fraction_masks(scores, 0.4)
    assert got["a"].tolist() == [True, False, True] and got["b"].tolist() == [[False, False]]
    got = top_fraction_masks(scores, 0.6)  # k = 3: all three 3s
    assert got["a"].tolist() == [True, False, True] and got["b"].tolist() == [[True, False]]
    got = top_fraction_masks(scores, 0.5, "per_tensor")  # a: int(1.5) = 1, b: int(1.0) = 1
    assert got["a"].tolist() == [True, False, False] and got["b"].tolist() == [[True, False]]
    assert not any(m.any() for m in top_fraction_masks(scores, 0.0).values())
    assert all(m.all() for m in top_fraction_masks(scores, 1.0).values())
    with pytest.raises(ValueError, match="scope"):
        top_fraction_masks(scores, 0.5, "per_row")
    with pytest.raises(ValueError, match="not finite"):
        top_fraction_masks({"a": torch.tensor([float("nan")])}, 0.5)


def _brute_top(scores: dict[str, torch.Tensor], fraction: float, scope: str) -> dict[str, torch.Tensor]:
    """Sort (-score, tensor position, flat index) by hand and take the first k."""
    groups = [list(scores)] if scope == "global" else [[n] for n in scores]
    out = {n: torch.zeros(s.numel(), dtype=torch.bool) for n, s in scores.items()}
    for group in groups:
        entries = [(-float(v), t, i, n) for t, n in enumerate(group) for i, v in enumerate(scores[n].reshape(-1))]
        k = int(fraction * len(entries))
        for _, _, i, n in sorted(entries)[:k]:
            out[n][i] = True
    return {n: m.reshape(scores[n].shape) for n, m in out.items()}


@pytest.mark.parametrize("scope", ["global", "per_tensor"])
@pytest.mark.parametrize("fraction", [0.1, 0.35, 0.8])
def test_top_fraction_matches_brute_force_with_ties(scope: str, fraction: float) -> None:
    g = torch.Generator().manual_seed(3)
    scores = {n: torch.randint(0, 4, shape, generator=g).float() for n, shape in [("x", (3, 5)), ("y", (7,))]}
    got = top_fraction_masks(scores, fraction, scope)
    expected = _brute_top(scores, fraction, scope)
    for n in scores:
        assert torch.equal(got[n], expected[n]), n


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"ratio": 0.0}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"mu": 0.0}, "mu"),
        ({"objective": "simnpo"}, "objective"),
        ({"target": "embeddings"}, "target"),
        ({"scope": "per_row"}, "scope"),
        ({"batch_size": 0}, "batch_size"),
        ({"retain_loss_type": "mse"}, "retain_loss_type"),
    ],
)
def test_wagle_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_method("wagle", **kwargs)


def test_wagle_objective_delegates() -> None:
    assert not make_method("wagle").needs_reference
    assert make_method("wagle", objective="npo").needs_reference
    assert make_method("wagle", retain_loss_type="kl").needs_reference
    from dataclasses import asdict

    assert asdict(make_method("wagle", objective="npo", beta=0.3))["beta"] == 0.3  # the manifest's method_args


# -- Selective Pruning: pure functions -------------------------------------------------------------------------


def test_sp_scores_by_hand_with_eps() -> None:
    xf = torch.tensor([1.0, 2.0, 0.0, 3.0])
    xr = torch.tensor([1.0, 0.0, 0.0, 3.0])
    assert sp_scores(xf, xr, eps=0.5).tolist() == [1 / 1.5, 4.0, 0.0, 3 / 3.5]
    # eps decides between "quiet on retain" and "loud on forget": eps 1e-5 favours neuron 0, eps 1 neuron 1
    xf, xr = torch.tensor([0.01, 10.0]), torch.tensor([0.0, 1.0])
    pick = {"d": xf}, {"d": xr}
    assert sp_prune_masks(*pick, SPConfig(frac=0.5, eps=1e-5))["d"].tolist() == [True, False]
    assert sp_prune_masks(*pick, SPConfig(frac=0.5, eps=1.0))["d"].tolist() == [False, True]
    with pytest.raises(ValueError, match="x_retain"):
        sp_scores(xf, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="eps"):
        sp_scores(xf, xr, eps=0.0)


def test_sp_pruned_set_global_per_layer_and_ties() -> None:
    xf = {"l0": torch.tensor([4.0, 1.0, 2.0, 2.0]), "l1": torch.tensor([2.0, 8.0, 1.0, 0.5])}
    xr = {"l0": torch.ones(4), "l1": torch.tensor([1.0, 2.0, 1.0, 1.0])}
    # eps -> 0: s = l0 [4, 1, 2, 2], l1 [2, 4, 1, 0.5]; global k = int(0.5 * 8) = 4:
    # the two 4s, then two of the three tied 2s -> l0[2], l0[3] (earlier layer first), not l1[0]
    got = sp_prune_masks(xf, xr, SPConfig(frac=0.5, eps=1e-12))
    assert got["l0"].tolist() == [True, False, True, True] and got["l1"].tolist() == [False, True, False, False]
    got = sp_prune_masks(xf, xr, SPConfig(frac=0.5, eps=1e-12, scope="per_layer"))  # 2 per layer
    assert got["l0"].tolist() == [True, False, True, False] and got["l1"].tolist() == [True, True, False, False]
    assert not any(m.any() for m in sp_prune_masks(xf, xr, SPConfig(frac=0.1)).values())  # int(0.8) = 0
    with pytest.raises(ValueError, match="x_retain"):
        sp_prune_masks(xf, {"l0": xr["l0"]}, SPConfig())


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"frac": 1.0}, "frac"),
        ({"frac": -0.1}, "frac"),
        ({"eps": 0.0}, "eps"),
        ({"scope": "per_row"}, "scope"),
        ({"mode": "rows"}, "mode"),
        ({"calib_samples": 0}, "calib_samples"),
        ({"max_length": 1.5}, "max_length"),
        ({"seed": "a"}, "seed"),
    ],
)
def test_sp_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SPConfig.{field}"):
        SPConfig(**kwargs).validate()


@pytest.mark.parametrize("mode", ["neuron", "down"])
def test_apply_zeroes_exactly_the_chosen_neurons(mode: str) -> None:
    model = _tiny_llama()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    downs = list(mlp_neurons(model))
    assert downs == [f"model.layers.{i}.mlp.down_proj.weight" for i in range(2)]
    xf = {
        downs[0]: torch.tensor([1.0, 5.0, 1.0, 1.0, 1.0, 1.0]),
        downs[1]: torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 9.0]),
    }
    xr = {n: torch.ones(6) for n in downs}
    xf["model.layers.0.self_attn.q_proj.weight"] = torch.ones(8)  # extra statistics are ignored
    stats = apply_selective_pruning(model, xf, xr, SPConfig(frac=2 / 12 + 1e-9, mode=mode))  # k = 2 of 12
    assert stats["neurons"] == {downs[0]: [1], downs[1]: [5]} and stats["pruned_total"] == 2
    assert stats["neurons_total"] == 12
    changed = set()
    for name, value in model.state_dict().items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        j = {0: 1, 1: 5}.get(layer)
        expected = before[name].clone()
        if name.endswith("mlp.down_proj.weight"):
            expected[:, j] = 0
        elif mode == "neuron" and (name.endswith("mlp.gate_proj.weight") or name.endswith("mlp.up_proj.weight")):
            expected[j, :] = 0
        assert torch.equal(value, expected), name
        if not torch.equal(value, before[name]):
            changed.add(name)
    assert changed == set(stats["zeroed"])
    assert len(changed) == (6 if mode == "neuron" else 2)
