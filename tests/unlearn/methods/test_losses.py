"""Unit tests for lacuna_unlearn.methods.losses against hand computations on tiny tensors
(docs/definitions.md#unlearning-losses, #jensun-objective)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lacuna_unlearn.methods import losses as L

B, T, V = 2, 4, 3


def _logits(seed: int = 0, shape: tuple[int, ...] = (B, T, V), scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).float()


# Q:/A: style: prompt tokens are -100, answer tokens labelled; row 1 has a shorter prompt.
LABELS = torch.tensor([[-100, -100, 2, 0], [-100, 1, 2, 1]])


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _manual_seq_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Summed -log softmax over labelled next tokens and their counts, per sequence."""
    lp = _np_log_softmax(logits.detach().numpy())
    lab = labels.numpy()
    nll = np.zeros(lab.shape[0])
    cnt = np.zeros(lab.shape[0])
    for b in range(lab.shape[0]):
        for t in range(lab.shape[1] - 1):
            y = lab[b, t + 1]
            if y != -100:
                nll[b] -= lp[b, t, y]
                cnt[b] += 1
    return nll, cnt


def _np_log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.log1p(np.exp(-x))


def _np_jsd_clamped(p: np.ndarray, q: np.ndarray, eps: float = 1e-9) -> float:
    m = np.maximum(0.5 * (p + q), eps)
    p = np.maximum(p, eps)
    q = np.maximum(q, eps)
    return float(0.5 * (np.sum(p * (np.log(p) - np.log(m))) + np.sum(q * (np.log(q) - np.log(m)))))


def _np_jsd(p: np.ndarray, q: np.ndarray) -> float:
    m = 0.5 * (p + q)
    out = 0.0
    for a in (p, q):
        nz = a > 0
        out += 0.5 * float(np.sum(a[nz] * (np.log(a[nz]) - np.log(m[nz]))))
    return out


# ----------------------------------------------------------------------------- NLL family


def test_shifted_and_shape_check():
    logits = _logits()
    s_logits, s_labels = L.shifted(logits, LABELS)
    assert s_logits.shape == (B, T - 1, V) and s_labels.shape == (B, T - 1)
    assert torch.equal(s_labels, LABELS[:, 1:])
    assert torch.equal(s_logits, logits[:, :-1])
    with pytest.raises(ValueError):
        L.shifted(logits, LABELS[:, :-1])


def test_token_nll_counts_and_nll_loss_match_manual_and_cross_entropy():
    logits = _logits(1)
    nll, cnt = _manual_seq_nll(logits, LABELS)
    assert np.allclose(L.token_nll(logits, LABELS).numpy(), nll, atol=1e-5)
    assert L.token_counts(LABELS).tolist() == [2, 3] == cnt.tolist()
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, V), LABELS[:, 1:].reshape(-1), ignore_index=-100)
    got = L.nll_loss(logits, LABELS)
    assert torch.allclose(got, ref, atol=1e-6)
    assert math.isclose(got.item(), nll.sum() / cnt.sum(), rel_tol=1e-5)
    assert torch.allclose(L.grad_ascent_loss(logits, LABELS), -ref, atol=1e-6)


def test_nll_ignores_masked_positions_and_handles_empty_batch():
    logits = _logits(2)
    other = logits.clone()
    other[0, 0] += 5.0  # predicts labels[0, 1] = -100: must not matter
    other[:, -1] -= 7.0  # last position predicts nothing
    assert torch.allclose(L.nll_loss(other, LABELS), L.nll_loss(logits, LABELS))
    assert torch.allclose(L.token_nll(other, LABELS), L.token_nll(logits, LABELS))
    empty = torch.full_like(LABELS, -100)
    assert L.nll_loss(logits, empty).item() == 0.0
    assert L.token_counts(empty).tolist() == [0, 0]


# ----------------------------------------------------------------------------- NPO / SimNPO


def test_npo_zero_log_ratio_is_two_over_beta_log2():
    logits = _logits(3)
    for beta in (0.1, 1.0):
        got = L.npo_loss(logits, LABELS, logits.clone(), beta=beta)
        assert math.isclose(got.item(), 2.0 / beta * math.log(2.0), rel_tol=1e-5)


def test_npo_matches_manual_and_decreases_with_forget_nll():
    beta = 0.5
    logits, ref = _logits(4), _logits(5)
    nll, _ = _manual_seq_nll(logits, LABELS)
    ref_nll, _ = _manual_seq_nll(ref, LABELS)
    r = ref_nll - nll  # log p_theta(y|x) - log p_ref(y|x)
    want = float(np.mean(-(2.0 / beta) * _np_log_sigmoid(-beta * r)))
    assert math.isclose(L.npo_loss(logits, LABELS, ref, beta=beta).item(), want, rel_tol=1e-5)

    # Sign: the loss must go DOWN as the forget NLL goes up (unlearning direction).
    ref_nll_t = torch.tensor([3.0, 3.0])
    vals = [L.npo_loss_from_nll(torch.tensor([x, x]), ref_nll_t, beta).item() for x in (1.0, 3.0, 6.0, 20.0)]
    assert all(a > b for a, b in zip(vals, vals[1:], strict=False))
    nll_leaf = torch.tensor([2.0, 4.0], requires_grad=True)
    L.npo_loss_from_nll(nll_leaf, ref_nll_t, beta).backward()
    assert (nll_leaf.grad < 0).all()
    # Lowering the labelled tokens' logits (higher NLL) lowers the loss.
    worse = logits.clone()
    worse[0, 1, 2] -= 5.0
    worse[1, 0, 1] -= 5.0
    assert L.npo_loss(worse, LABELS, ref, beta).item() < L.npo_loss(logits, LABELS, ref, beta).item()


def test_simnpo_matches_manual_and_sign_convention():
    beta, delta = 4.5, 0.3
    logits = _logits(6)
    nll, cnt = _manual_seq_nll(logits, LABELS)
    want = float(np.mean(-(2.0 / beta) * _np_log_sigmoid(beta * (nll / cnt - delta))))
    assert math.isclose(L.simnpo_loss(logits, LABELS, beta=beta, delta=delta).item(), want, rel_tol=1e-5)
    # avg NLL == delta -> (2/beta) log 2
    at_delta = L.simnpo_loss_from_nll(torch.tensor([1.2, 0.6]), torch.tensor([4, 2]), beta=10.0, delta=0.3)
    assert math.isclose(at_delta.item(), 2.0 / 10.0 * math.log(2.0), rel_tol=1e-6)
    # Decreasing in the (length-normalised) forget NLL, towards 0.
    counts = torch.tensor([2, 2])
    vals = [L.simnpo_loss_from_nll(torch.tensor([x, x]), counts, beta, delta).item() for x in (0.0, 1.0, 4.0, 40.0)]
    assert all(a > b for a, b in zip(vals, vals[1:], strict=False))
    assert vals[-1] < 1e-6
    nll_leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    L.simnpo_loss_from_nll(nll_leaf, counts, beta, delta).backward()
    assert (nll_leaf.grad < 0).all()


def test_simnpo_and_npo_skip_sequences_without_labels():
    logits, ref = _logits(7), _logits(8)
    labels = LABELS.clone()
    labels[0] = -100  # answer truncated away
    one = L.simnpo_loss(logits[1:], labels[1:])
    assert torch.allclose(L.simnpo_loss(logits, labels), one)
    assert torch.isfinite(L.simnpo_loss(logits, labels))
    assert torch.allclose(L.npo_loss(logits, labels, ref), L.npo_loss(logits[1:], labels[1:], ref[1:]))


# ----------------------------------------------------------------------------- KL / retain dispatch


def test_kl_retain_zero_equal_positive_otherwise_and_manual():
    logits, ref = _logits(9), _logits(10)
    assert abs(L.kl_retain_loss(logits, logits.clone()).item()) < 1e-6
    got = L.kl_retain_loss(logits, ref).item()
    assert got > 0
    lq, lp = _np_log_softmax(logits.numpy()), _np_log_softmax(ref.numpy())
    want = float(np.sum(np.exp(lp) * (lp - lq)) / (B * T))  # KL(p_ref || q) over ALL positions, /(B*T)
    assert math.isclose(got, want, rel_tol=1e-5)
    with pytest.raises(ValueError):
        L.kl_retain_loss(logits, ref[:, :-1])


def test_retain_loss_dispatch():
    logits, ref = _logits(11), _logits(12)
    assert torch.equal(L.retain_loss(logits, LABELS), L.nll_loss(logits, LABELS))
    assert torch.equal(L.retain_loss(logits, LABELS, kind="NLL"), L.nll_loss(logits, LABELS))
    assert torch.equal(L.retain_loss(logits, LABELS, ref, kind="kl"), L.kl_retain_loss(logits, ref))
    assert torch.equal(L.retain_loss(logits, LABELS, ref, kind="jsd"), L.jensun_retain_loss(logits, ref, LABELS))
    assert torch.equal(
        L.retain_loss(logits, LABELS, ref, kind="jsd", legacy_unmasked=True),
        L.jensun_retain_loss(logits, ref, LABELS, legacy_unmasked=True),
    )
    with pytest.raises(ValueError):
        L.retain_loss(logits, LABELS, kind="kl")
    with pytest.raises(ValueError):
        L.retain_loss(logits, LABELS, ref, kind="embed_diff")


# ----------------------------------------------------------------------------- JSD / JensUn


def test_jsd_properties_and_manual():
    a, b = _logits(13, (5, V)), _logits(14, (5, V))
    la, lb = F.log_softmax(a, -1), F.log_softmax(b, -1)
    d_ab, d_ba = L.jsd(la, lb), L.jsd(lb, la)
    assert d_ab.shape == (5,)
    assert torch.allclose(d_ab, d_ba, atol=1e-7)
    assert torch.allclose(L.jsd(la, la), torch.zeros(5), atol=1e-7)
    assert (d_ab >= 0).all() and (d_ab <= L.LN2 + 1e-7).all()
    want = [_np_jsd(np.exp(x), np.exp(y)) for x, y in zip(la.double().numpy(), lb.double().numpy(), strict=True)]
    assert np.allclose(d_ab.numpy(), want, atol=1e-6)
    # disjoint one-hots (exact zeros, log = -inf) -> ln 2
    p, q = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    assert math.isclose(L.jsd(p.log(), q.log()).item(), math.log(2.0), rel_tol=1e-6)
    # large but finite logits: still ~ln 2 and bounded
    big = L.jsd(F.log_softmax(torch.tensor([40.0, 0.0, 0.0]), -1), F.log_softmax(torch.tensor([0.0, 40.0, 0.0]), -1))
    assert abs(big.item() - math.log(2.0)) < 1e-5


# prompt = positions 0, 1 (row 0) / 0 (row 1); answer tokens follow. After the shift row 0 has 3 answer
# positions (1, 2, 3 predict tokens 2, 3, 4) and row 1 has 4 (0..3).
J_LABELS = torch.tensor([[-100, -100, 4, 4, 4], [-100, 0, 0, 0, 0]])
J_V = 5
REFUSAL = [3, 1]  # a, b


def _peaked_logits(targets: dict[tuple[int, int], int], scale: float = 40.0) -> torch.Tensor:
    z = torch.zeros(2, 5, J_V)
    for (b, t), tok in targets.items():
        z[b, t, tok] = scale
    return z


def test_jensun_cyclic_targets_a_b_a():
    a, b = REFUSAL
    # Row 0 answer positions 1,2,3 -> a, b, a; row 1 positions 0..3 -> a, b, a, b (k restarts per row).
    good = {(0, 1): a, (0, 2): b, (0, 3): a, (1, 0): a, (1, 1): b, (1, 2): a, (1, 3): b}
    z = _peaked_logits(good)
    z[0, 0, 0] = 40.0  # prompt position (predicts a -100 label): ignored
    assert L.jensun_forget_loss(z, J_LABELS, REFUSAL).item() < 1e-6
    # Non-cyclic (always a) or swapped order (b, a, b) both pay ~ln 2 at the mismatched positions.
    always_a = _peaked_logits({k: a for k in good})
    swapped = _peaked_logits({k: (b if v == a else a) for k, v in good.items()})
    loss_a = L.jensun_forget_loss(always_a, J_LABELS, REFUSAL).item()
    loss_sw = L.jensun_forget_loss(swapped, J_LABELS, REFUSAL).item()
    assert math.isclose(loss_a, 3 / 7 * math.log(2.0), rel_tol=1e-4)  # 3 of 7 positions want b
    assert math.isclose(loss_sw, math.log(2.0), rel_tol=1e-4)


def test_jensun_forget_manual_value_and_mask():
    z = _logits(15, (2, 5, J_V))
    probs = torch.softmax(z.double(), -1).numpy()
    terms = []
    for b, positions in ((0, [1, 2, 3]), (1, [0, 1, 2, 3])):
        for k, t in enumerate(positions):
            q = np.zeros(J_V)
            q[REFUSAL[k % 2]] = 1.0
            terms.append(_np_jsd_clamped(probs[b, t], q))
    want = sum(terms) / (len(terms) + 1e-8)
    got = L.jensun_forget_loss(z, J_LABELS, REFUSAL)
    assert math.isclose(got.item(), want, rel_tol=1e-5)
    # positions predicting -100 labels (row 0 pos 0, last positions) are ignored
    z2 = z.clone()
    z2[0, 0] += torch.tensor([9.0, -3.0, 0.0, 1.0, 2.0])
    z2[:, -1] *= 3.0
    assert torch.allclose(L.jensun_forget_loss(z2, J_LABELS, REFUSAL), got)
    with pytest.raises(ValueError):
        L.jensun_forget_loss(z, J_LABELS, [])
    with pytest.raises(ValueError):
        L.jensun_forget_loss(z, J_LABELS, [J_V])


def test_jensun_forget_legacy_all_positions_unnormalised_target():
    z = _logits(16, (2, 5, J_V))
    probs = torch.softmax(z.double(), -1).numpy()
    peaked = np.zeros(J_V)
    peaked[REFUSAL] = 1.0  # 1 on every refusal column at every position (sums to 2)
    want = np.mean([_np_jsd_clamped(probs[b, t], peaked) for b in range(2) for t in range(5)])
    legacy = L.jensun_forget_loss(z, J_LABELS, REFUSAL, legacy_unmasked=True)
    assert math.isclose(legacy.item(), float(want), rel_tol=1e-5)
    assert not math.isclose(legacy.item(), L.jensun_forget_loss(z, J_LABELS, REFUSAL).item(), rel_tol=1e-3)
    # legacy is unmasked: prompt positions and labels-independent
    z2 = z.clone()
    z2[0, 0] += 4.0 * F.one_hot(torch.tensor(0), J_V)
    assert not torch.allclose(L.jensun_forget_loss(z2, J_LABELS, REFUSAL, legacy_unmasked=True), legacy)
    no_labels = torch.full_like(J_LABELS, -100)
    assert torch.equal(L.jensun_forget_loss(z, no_labels, REFUSAL, legacy_unmasked=True), legacy)


def test_jensun_retain_head_and_legacy():
    z, ref = _logits(17, (2, 5, J_V)), _logits(18, (2, 5, J_V))
    p, pr = torch.softmax(z.double(), -1).numpy(), torch.softmax(ref.double(), -1).numpy()
    answer = [(0, t) for t in (1, 2, 3)] + [(1, t) for t in (0, 1, 2, 3)]
    want = np.mean([_np_jsd(pr[b, t], p[b, t]) for b, t in answer])
    got = L.jensun_retain_loss(z, ref, J_LABELS)
    assert math.isclose(got.item(), float(want), rel_tol=1e-5)
    assert L.jensun_retain_loss(z, z.clone(), J_LABELS).item() < 1e-7
    z2 = z.clone()
    z2[0, 0] += 3.0 * F.one_hot(torch.tensor(1), J_V)  # prompt position: ignored by HEAD
    assert torch.allclose(L.jensun_retain_loss(z2, ref, J_LABELS), got)
    want_legacy = np.mean([_np_jsd_clamped(pr[b, t], p[b, t]) for b in range(2) for t in range(5)])
    legacy = L.jensun_retain_loss(z, ref, J_LABELS, legacy_unmasked=True)
    assert math.isclose(legacy.item(), float(want_legacy), rel_tol=1e-5)
    assert not torch.allclose(L.jensun_retain_loss(z2, ref, J_LABELS, legacy_unmasked=True), legacy)
    assert L.jensun_retain_loss(z, ref, torch.full_like(J_LABELS, -100)).item() == 0.0


# ----------------------------------------------------------------------------- RMU


def test_rmu_control_vector_unit_norm_deterministic_seeded():
    u = L.rmu_control_vector(16, seed=0)
    assert u.shape == (1, 1, 16) and u.dtype == torch.float32
    assert math.isclose(torch.linalg.vector_norm(u).item(), 1.0, rel_tol=1e-6)
    assert (u >= 0).all()  # torch.rand direction: non-negative orthant
    torch.manual_seed(123)  # global RNG state must not matter
    assert torch.equal(L.rmu_control_vector(16, seed=0), u)
    assert not torch.allclose(L.rmu_control_vector(16, seed=1), u)
    with pytest.raises(ValueError):
        L.rmu_control_vector(0, seed=0)


def test_rmu_losses_by_hand():
    d, c = 4, 2.0
    u = L.rmu_control_vector(d, seed=7)
    h = _logits(19, (2, 3, d))
    mask = torch.tensor([[False, True, True], [True, False, False]])
    hn, un = h.double().numpy(), (c * u).double().numpy()[0, 0]
    per_seq = [np.mean([np.sum((hn[b, t] - un) ** 2) / d for t in range(3) if mask[b, t]]) for b in range(2)]
    got = L.rmu_forget_loss(h, mask, u, c)
    assert math.isclose(got.item(), float(np.mean(per_seq)), rel_tol=1e-5)
    # masked-out tokens don't matter; mask=None uses all tokens
    h2 = h.clone()
    h2[0, 0] += 10.0
    assert torch.allclose(L.rmu_forget_loss(h2, mask, u, c), got)
    all_tok = np.mean([np.sum((hn[b, t] - un) ** 2) / d for b in range(2) for t in range(3)])
    assert math.isclose(L.rmu_forget_loss(h, None, u, c).item(), float(all_tok), rel_tol=1e-5)
    # at the steering target the loss is 0
    assert L.rmu_forget_loss((c * u).expand(2, 3, d).clone(), mask, u, c).item() < 1e-12

    ref = _logits(20, (2, 3, d))
    rn = ref.double().numpy()
    per_seq_r = [np.mean([np.sum((hn[b, t] - rn[b, t]) ** 2) / d for t in range(3) if mask[b, t]]) for b in range(2)]
    assert math.isclose(L.rmu_retain_loss(h, ref, mask).item(), float(np.mean(per_seq_r)), rel_tol=1e-5)
    assert L.rmu_retain_loss(h, h.clone(), mask).item() == 0.0
    with pytest.raises(ValueError):
        L.rmu_forget_loss(h, mask[:, :2], u, c)


# ----------------------------------------------------------------------------- gradients / combine


def _grad(fn, logits: torch.Tensor) -> torch.Tensor:
    leaf = logits.clone().requires_grad_(True)
    loss = fn(leaf)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    return leaf.grad


def test_gradients_flow_and_respect_masks():
    logits, ref = _logits(21), _logits(22)
    masked_rows = [(0, 0), (0, 3), (1, 3)]  # positions whose next label is -100, plus the last position
    fns = {
        "nll": lambda z: L.nll_loss(z, LABELS),
        "ga": lambda z: L.grad_ascent_loss(z, LABELS),
        "npo": lambda z: L.npo_loss(z, LABELS, ref),
        "simnpo": lambda z: L.simnpo_loss(z, LABELS),
        "jsd_retain": lambda z: L.jensun_retain_loss(z, ref, LABELS),
        "jensun": lambda z: L.jensun_forget_loss(z, LABELS, [2, 0]),
    }
    for name, fn in fns.items():
        g = _grad(fn, logits)
        assert g.abs().sum() > 0, name
        for b, t in masked_rows:
            assert torch.all(g[b, t] == 0), (name, b, t)
    for fn in (
        lambda z: L.kl_retain_loss(z, ref),
        lambda z: L.jensun_forget_loss(z, LABELS, [2, 0], legacy_unmasked=True),
        lambda z: L.jensun_retain_loss(z, ref, LABELS, legacy_unmasked=True),
    ):
        g = _grad(fn, logits)
        assert all(g[b, t].abs().sum() > 0 for b, t in masked_rows)  # unmasked variants touch every position
    # extreme logits stay finite
    _grad(lambda z: L.jensun_forget_loss(z, LABELS, [2, 0]), logits * 100)
    _grad(lambda z: L.jensun_retain_loss(z, ref * 100, LABELS), logits * 100)
    # reference tensors are treated as constants
    ref_leaf = ref.clone().requires_grad_(True)
    L.npo_loss(logits.clone().requires_grad_(True), LABELS, ref_leaf).backward()
    assert ref_leaf.grad is None
    # RMU
    h = _logits(23, (2, 3, 4)).requires_grad_(True)
    L.rmu_forget_loss(h, torch.ones(2, 3, dtype=torch.bool), L.rmu_control_vector(4, 0), 2.0).backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0


def test_combine():
    f, r = torch.tensor(2.0), torch.tensor(5.0)
    assert L.combine(f, r, gamma=3.0, alpha=0.01).item() == pytest.approx(3.0 * 2.0 + 0.01 * 5.0)
    assert L.combine(f, None, gamma=0.5).item() == pytest.approx(1.0)
    assert L.combine(f, r).item() == pytest.approx(7.0)
