"""FRP (docs/definitions.md#frp, code path ``--scoring rank_combo``): scores and masks against a brute-force loop,
the retain veto, Conv1D layout, in-place pruning of a tiny Llama. The end-to-end run with its cache:
tests/e2e/test_frp_run.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lacuna_unlearn.methods.frp import FRPConfig, apply_frp, frp_prune_mask, frp_scores

MLP = ("gate_proj", "up_proj", "down_proj")


def _brute_ranks(values: list[float]) -> list[int]:
    """Ascending rank of each value, ties by index (a stable argsort's argsort), by counting."""
    return [
        sum(1 for k, v in enumerate(values) if v < values[j] or (v == values[j] and k < j)) for j in range(len(values))
    ]


def _brute_scores(w: np.ndarray, xf: np.ndarray, xr: np.ndarray, lam: float, beta: float) -> np.ndarray:
    d_out, d_in = w.shape
    r = [float(xf[j]) / (float(xr[j]) + 1e-6) for j in range(d_in)]
    rank_r = _brute_ranks(r)
    s = np.zeros((d_out, d_in), dtype=np.float64)
    for i in range(d_out):
        rank_w = _brute_ranks([abs(float(w[i, j])) for j in range(d_in)])
        for j in range(d_in):
            s[i, j] = rank_r[j] + lam * rank_w[j]
        n_protect = int(beta * d_in)
        if n_protect:
            p = [abs(float(w[i, j])) * float(xr[j]) / (float(xf[j]) + 1e-6) for j in range(d_in)]
            for j in sorted(range(d_in), key=lambda j: -p[j])[:n_protect]:
                s[i, j] = -np.inf
    return s


def _brute_mask(s: np.ndarray, k: int) -> np.ndarray:
    mask = np.zeros(s.shape, dtype=bool)
    for i in range(s.shape[0]):
        for j in sorted(range(s.shape[1]), key=lambda j: -s[i, j])[:k]:
            if s[i, j] > -np.inf:
                mask[i, j] = True
    return mask


def _random(d_out: int, d_in: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_out, d_in, generator=g)
    xf = torch.rand(d_in, generator=g) + 0.1
    xr = torch.rand(d_in, generator=g) + 0.1
    return w, xf, xr


@pytest.mark.parametrize("beta", [0.0, 0.25])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scores_and_mask_match_brute_force(seed: int, beta: float) -> None:
    # d_in = 16 and lam = 0.05: lam * rank(|W|) <= 0.75 < 1, so S has no ties and the top-k set is unique.
    w, xf, xr = _random(7, 16, seed)
    expected = _brute_scores(w.numpy(), xf.numpy(), xr.numpy(), 0.05, beta)
    got = frp_scores(w, xf, xr, lam=0.05, beta=beta)
    assert got.shape == w.shape
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-9)
    cfg = FRPConfig(rho=0.25, lam=0.05, beta=beta)
    mask = frp_prune_mask(w, xf, xr, cfg)
    assert mask.dtype == torch.bool
    np.testing.assert_array_equal(mask.numpy(), _brute_mask(expected, int(0.25 * 16)))


def test_ties_rank_by_index() -> None:
    # Equal |W| and equal r: the stable argsort().argsort() ranks ties by column index.
    w = torch.tensor([[1.0, -1.0, 2.0, 1.0]])
    xf = torch.tensor([1.0, 1.0, 1.0, 1.0])
    xr = torch.tensor([1.0, 1.0, 1.0, 1.0])
    s = frp_scores(w, xf, xr, lam=0.5)
    # rank(r) = [0,1,2,3]; rank(|W|) = [0,1,3,2]
    assert s.tolist() == [[0.0, 1.5, 3.5, 4.0]]


def test_mask_is_a_valid_top_k_with_ties() -> None:
    # Larger d_in: S can tie; whatever topk picks must still be k entries no smaller than any unpruned one.
    w, xf, xr = _random(12, 200, 3)
    w = w.to(torch.bfloat16).float()  # many |W| ties, as in bf16 checkpoints
    cfg = FRPConfig(rho=0.1, lam=0.05)
    s = frp_scores(w, xf, xr, lam=cfg.lam)
    mask = frp_prune_mask(w, xf, xr, cfg)
    assert (mask.sum(dim=1) == int(0.1 * 200)).all()
    for i in range(w.shape[0]):
        assert s[i][mask[i]].min() >= s[i][~mask[i]].max()


def test_rank_term_dominates_magnitude_for_small_lambda() -> None:
    # With lam * (d_in - 1) < 1 the order is that of r alone: the top-k columns by r are pruned in every row.
    w, xf, xr = _random(5, 10, 4)
    cfg = FRPConfig(rho=0.3, lam=0.05)
    mask = frp_prune_mask(w, xf, xr, cfg)
    top_r = set(torch.topk(xf / (xr + 1e-6), 3).indices.tolist())
    for i in range(5):
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == top_r


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_veto_entries_never_pruned(beta: float) -> None:
    w, xf, xr = _random(9, 40, 5)
    d_in = 40
    n_protect = int(beta * d_in)
    p = w.abs() * (xr / (xf + 1e-6))
    protected = torch.zeros_like(w, dtype=torch.bool).scatter_(1, torch.topk(p, n_protect, dim=1).indices, True)
    s = frp_scores(w, xf, xr, lam=0.05, beta=beta)
    assert torch.equal(torch.isneginf(s), protected)
    cfg = FRPConfig(rho=0.5, beta=beta)
    mask = frp_prune_mask(w, xf, xr, cfg)
    assert not (mask & protected).any()
    k = int(0.5 * d_in)
    assert (mask.sum(dim=1) == min(k, d_in - n_protect)).all()


@pytest.mark.parametrize("rho", [0.03, 0.1, 0.37, 0.99])
def test_exactly_k_per_row(rho: float) -> None:
    w, xf, xr = _random(6, 101, 6)
    mask = frp_prune_mask(w, xf, xr, FRPConfig(rho=rho))
    assert (mask.sum(dim=1) == int(rho * 101)).all()


def test_rho_zero_prunes_nothing() -> None:
    w, xf, xr = _random(6, 50, 7)
    assert not frp_prune_mask(w, xf, xr, FRPConfig(rho=0.0)).any()


@pytest.mark.parametrize("beta", [0.0, 0.2])
def test_conv1d_transposed_equivalence(beta: float) -> None:
    w, xf, xr = _random(11, 30, 8)  # (d_out, d_in)
    cfg = FRPConfig(rho=0.2, beta=beta)
    mask = frp_prune_mask(w, xf, xr, cfg)
    mask_t = frp_prune_mask(w.t().contiguous(), xf, xr, cfg, transposed=True)
    assert mask_t.shape == (30, 11)
    assert torch.equal(mask_t, mask.t())
    s = frp_scores(w, xf, xr, lam=0.05, beta=beta)
    s_t = frp_scores(w.t().contiguous(), xf, xr, lam=0.05, beta=beta, transposed=True)
    assert torch.equal(s_t, s.t())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rho": 1.0}, "rho"),
        ({"rho": -0.1}, "rho"),
        ({"rho": float("nan")}, "rho"),
        ({"target": "attention"}, "target"),
        ({"beta": 1.5}, "beta"),
        ({"lam": -1.0}, "lam"),
        ({"calib_samples": 0}, "calib_samples"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict, field: str) -> None:
    w, xf, xr = _random(3, 10, 9)
    with pytest.raises(ValueError, match=field):
        frp_prune_mask(w, xf, xr, FRPConfig(**kwargs))


def test_x_length_mismatch() -> None:
    w, xf, xr = _random(3, 10, 9)
    with pytest.raises(ValueError, match="x_forget"):
        frp_prune_mask(w, xf[:9], xr, FRPConfig())
    with pytest.raises(ValueError, match="x_retain"):
        frp_scores(w, xf, torch.rand(11), lam=0.05)
    # Conv1D layout: d_in is the row count of the stored weight
    with pytest.raises(ValueError, match="x_forget"):
        frp_prune_mask(w, xf, xr, FRPConfig(), transposed=True)


# -- models ----------------------------------------------------------------------------------------------------


def _tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def _random_stats(model: torch.nn.Module, target: str) -> tuple[dict, dict]:
    from lacuna_metrics.frag.activations import linear_weight_names

    g = torch.Generator().manual_seed(1)
    params = dict(model.named_parameters())
    xf, xr = {}, {}
    for name in linear_weight_names(model, target).values():
        d_in = params[name].shape[1]
        xf[name] = torch.rand(d_in, generator=g) + 0.1
        xr[name] = torch.rand(d_in, generator=g) + 0.1
    return xf, xr


def test_apply_frp_prunes_only_mlp() -> None:
    model = _tiny_llama()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    xf, xr = _random_stats(model, "all")  # extra (attention) keys are ignored with target="mlp"
    cfg = FRPConfig(rho=0.1)
    expected = {
        name: frp_prune_mask(before[name], xf[name], xr[name], cfg) for name in xf if name.split(".")[-2] in MLP
    }
    stats = apply_frp(model, xf, xr, cfg)
    after = model.state_dict()
    assert set(stats["pruned"]) == set(expected) and len(expected) == 6
    for name, value in after.items():
        if name in expected:
            mask = expected[name]
            assert (value[mask] == 0).all()
            assert torch.equal(value[~mask], before[name][~mask])
            d_out, d_in = value.shape
            assert stats["pruned"][name] == int(mask.sum()) == d_out * int(0.1 * d_in)
        else:
            assert torch.equal(value, before[name]), name
    assert stats["pruned_total"] == sum(stats["pruned"].values())


def test_apply_frp_shrink_and_all_target() -> None:
    model = _tiny_llama()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    xf, xr = _random_stats(model, "all")
    cfg = FRPConfig(rho=0.25, shrink=0.5, target="all")
    stats = apply_frp(model, xf, xr, cfg)
    assert stats["modules"] == 14
    after = model.state_dict()
    for name in xf:
        mask = frp_prune_mask(before[name], xf[name], xr[name], cfg)
        assert torch.equal(after[name][mask], before[name][mask] * 0.5)
        assert torch.equal(after[name][~mask], before[name][~mask])
    assert torch.equal(after["lm_head.weight"], before["lm_head.weight"])


def test_apply_frp_missing_stats() -> None:
    model = _tiny_llama()
    xf, xr = _random_stats(model, "mlp")
    name = next(iter(xr))
    del xr[name]
    with pytest.raises(ValueError, match="x_retain"):
        apply_frp(model, xf, xr, FRPConfig())
    xf, xr = _random_stats(model, "mlp")
    xf[name] = xf[name][:-1]
    with pytest.raises(ValueError, match="x_forget"):
        apply_frp(model, xf, xr, FRPConfig())


def test_apply_frp_gpt2_conv1d() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from lacuna_metrics.frag.activations import linear_weight_names, transposed_weight_names

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    names = set(linear_weight_names(model, "linear").values())
    transposed = transposed_weight_names(model, "linear")
    assert transposed and transposed <= names
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(2)
    xf = {n: torch.rand(params[n].shape[0], generator=g) + 0.1 for n in names}  # Conv1D: d_in = rows
    xr = {n: torch.rand(params[n].shape[0], generator=g) + 0.1 for n in names}
    before = {n: params[n].detach().clone() for n in names}
    cfg = FRPConfig(rho=0.25, target="linear")
    stats = apply_frp(model, xf, xr, cfg)
    for n in names:
        expected = frp_prune_mask(before[n].t(), xf[n], xr[n], cfg).t()  # prune in (d_out, d_in) semantics
        assert torch.equal(params[n].detach() == 0, expected | (before[n] == 0))
        assert stats["pruned"][n] == before[n].shape[1] * int(0.25 * before[n].shape[0])
