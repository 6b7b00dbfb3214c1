"""Pure loss helpers shared by the unlearning methods (docs/definitions.md#unlearning-losses and
``#jensun-objective``).

Every function takes tensors (logits, labels, hidden states); none calls a model. Conventions
(docs/definitions.md#openunlearning-conventions, as in HF / OpenUnlearning):

* ``logits`` are ``[B, T, V]`` straight from the model, ``labels`` are ``[B, T]`` aligned with
  ``input_ids`` and equal to -100 wherever no loss is taken (prompt and padding: LACUNA "Q:/A:" QA
  puts the loss on the answer tokens only). Token-level losses apply the HF causal shift
  (``logits[:, :-1]`` predicts ``labels[:, 1:]``), see :func:`shifted`.
* Reference-model tensors (``ref_logits``, ``ref_hidden``) are detached here, so callers may pass
  them with or without ``torch.no_grad``.
* Logits are upcast to float32 before softmax (as HF does for its LM loss).
* Sign convention: every function returns a quantity to MINIMISE. Unlearning raises the forget NLL,
  so all forget losses decrease as ``token_nll`` on the forget set increases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100
LN2 = math.log(2.0)  # upper bound of the natural-log JSD
JSD_PROB_EPS = 1e-9  # JensUn clamps probabilities (and M) at 1e-9 (docs/definitions.md#jensun-objective)
JSD_LOG_M_EPS = 1e-10  # JensUn HEAD retain JSD clamps M at 1e-10 before the log (ibid.)
_LOG_FLOOR = -1e4  # finite stand-in for log(0) so that 0 * log 0 has a zero (not NaN) gradient

RetainKind = Literal["nll", "kl", "jsd"]

__all__ = [
    "IGNORE_INDEX",
    "LN2",
    "combine",
    "dpo_loss",
    "grad_ascent_loss",
    "jensun_forget_loss",
    "jensun_retain_loss",
    "jsd",
    "kl_retain_loss",
    "nll_loss",
    "npo_loss",
    "npo_loss_from_nll",
    "random_label_loss",
    "retain_loss",
    "rmu_control_vector",
    "rmu_forget_loss",
    "rmu_retain_loss",
    "shifted",
    "simnpo_loss",
    "simnpo_loss_from_nll",
    "token_counts",
    "token_nll",
    "undial_loss",
]


# ------------------------------------------------------------- basics (notation: docs/definitions.md#unlearning-losses)


def shifted(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """HF causal shift: ``(logits[:, :-1], labels[:, 1:])`` — position t predicts token t+1."""
    if logits.shape[:2] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on [B, T]")
    return logits[:, :-1, :], labels[:, 1:]


def _answer_mask(labels: Tensor) -> Tensor:
    """Bool mask of the shifted labels that carry a loss (``labels[:, 1:] != -100``), shape [B, T-1]."""
    return labels[:, 1:] != IGNORE_INDEX


def _per_token_nll(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-position NLL after the shift, 0 where the label is -100; shape [B, T-1]."""
    s_logits, s_labels = shifted(logits, labels)
    return F.cross_entropy(
        s_logits.float().transpose(1, 2), s_labels, ignore_index=IGNORE_INDEX, reduction="none"
    )  # [B, T-1]


def token_nll(logits: Tensor, labels: Tensor) -> Tensor:
    """ℓ_θ(x, y) = −Σ_t log p_θ(y_t | ·), summed per sequence over labelled tokens; shape [B].

    Same as OpenUnlearning ``compute_batch_nll``.
    """
    return _per_token_nll(logits, labels).sum(dim=-1)


def token_counts(labels: Tensor) -> Tensor:
    """|y|: number of labelled tokens per sequence (after the shift, i.e. those ℓ_θ sums over); shape [B].

    OpenUnlearning counts ``labels != -100`` before the shift; the two agree whenever the first token is
    unlabelled, which is always the case with a prompt.
    """
    return _answer_mask(labels).sum(dim=-1)


def _mean_over_nonempty(values: Tensor, counts: Tensor) -> Tensor:
    """Mean of per-sequence ``values`` over sequences with at least one labelled token.

    Sequences whose answer was truncated away (|y| = 0) would give NaN (SimNPO, RMU) or a constant
    (NPO) in OpenUnlearning; here they are left out. An all-empty batch gives 0 (still in the graph).
    """
    valid = counts > 0
    n = valid.sum()
    return torch.where(valid, values, torch.zeros_like(values)).sum() / n.clamp(min=1)


def nll_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """NLL: HF mean token cross-entropy over all labelled tokens of the batch (notation of the definitions).

    Equals ``F.cross_entropy(shift_logits.flatten(0, 1), shift_labels.flatten(), ignore_index=-100)``,
    except that a batch with no labelled token gives 0 instead of NaN.
    """
    per_tok = _per_token_nll(logits, labels)
    return per_tok.sum() / _answer_mask(labels).sum().clamp(min=1)


# ---------------------------------------------------------------- forget losses (docs/definitions.md#unlearning-losses)


def grad_ascent_loss(forget_logits: Tensor, forget_labels: Tensor) -> Tensor:
    """GradAscent / GradDiff forget term: −NLL(D_f) (rows GradAscent and GradDiff of the definitions' table)."""
    return -nll_loss(forget_logits, forget_labels)


def npo_loss_from_nll(nll: Tensor, ref_nll: Tensor, beta: float = 0.1, counts: Tensor | None = None) -> Tensor:
    """NPO from per-sequence summed NLLs: −(2/β)·mean log σ(−β r), r = ℓ_ref − ℓ_θ (the definitions' NPO row).

    ``r = log p_θ(y|x) − log p_ref(y|x)``; r = 0 gives (2/β)·log 2; the loss decreases as ℓ_θ grows.
    ``counts`` (|y| per sequence), if given, drops sequences without labelled tokens from the mean.
    """
    r = ref_nll.detach() - nll
    per_seq = -F.logsigmoid(-beta * r) * (2.0 / beta)
    if counts is None:
        return per_seq.mean()
    return _mean_over_nonempty(per_seq, counts)


def npo_loss(logits: Tensor, labels: Tensor, ref_logits: Tensor, beta: float = 0.1) -> Tensor:
    """NPO forget loss: −(2/β)·E log σ(−β(ℓ_ref − ℓ_θ)) with token-summed ℓ (frozen reference)."""
    return npo_loss_from_nll(
        token_nll(logits, labels), token_nll(ref_logits.detach(), labels), beta, token_counts(labels)
    )


def simnpo_loss_from_nll(nll: Tensor, counts: Tensor, beta: float = 4.5, delta: float = 0.0) -> Tensor:
    """SimNPO from summed NLLs and |y|: −(2/β)·mean log σ(β(ℓ_θ/|y| − δ)) (the definitions' SimNPO row)."""
    avg = nll / counts.clamp(min=1).to(nll.dtype)
    per_seq = -F.logsigmoid(beta * (avg - delta)) * (2.0 / beta)
    return _mean_over_nonempty(per_seq, counts)


def simnpo_loss(logits: Tensor, labels: Tensor, beta: float = 4.5, delta: float = 0.0) -> Tensor:
    """SimNPO forget loss: −(2/β)·E log σ(β(ℓ_θ(x,y)/|y| − δ)), reference-free.

    Sign: the argument of σ is +β·(length-normalised NLL − δ), exactly as the formula of
    docs/definitions.md#unlearning-losses and OpenUnlearning ``simnpo.py`` (``-logsigmoid(beta * (nll/|y| - delta))``);
    the SimNPO paper's −(β/|y|)·log π_θ(y|x) − γ is the same thing with γ = β·δ. Raising the forget NLL raises the
    argument, so the loss decreases (towards 0) as unlearning proceeds; at ℓ_θ/|y| = δ it is (2/β)·log 2.
    """
    return simnpo_loss_from_nll(token_nll(logits, labels), token_counts(labels), beta, delta)


def undial_loss(logits: Tensor, labels: Tensor, ref_logits: Tensor, beta: float = 10.0, masked: bool = True) -> Tensor:
    """UNDIAL forget term: self-distillation to the frozen model's logits with the true next token pushed down.

    Soft target q = softmax(z_ref − β·onehot(y_next)); loss = CE(z_θ, q) = −Σ_v q_v log p_θ(v), averaged over
    the answer positions (``masked=True``, default) or, as OpenUnlearning's ``compute_undial_loss``, over every
    shifted position of the batch (prompt and padding included; a −100 label then indexes vocabulary entry
    V − 100 by negative indexing, reproduced here). Needs no reference beyond ``ref_logits``.
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} differ")
    s_logits, s_labels = shifted(logits, labels)
    s_ref = ref_logits[:, :-1, :].detach().float()
    vocab = s_ref.shape[-1]
    index = torch.where(s_labels == IGNORE_INDEX, s_labels + vocab, s_labels) if not masked else s_labels.clamp(min=0)
    target = s_ref - beta * F.one_hot(index, vocab).to(s_ref.dtype)
    ce = -(F.softmax(target, dim=-1) * F.log_softmax(s_logits.float(), dim=-1)).sum(dim=-1)  # [B, T-1]
    if not masked:
        return ce.mean()
    mask = s_labels != IGNORE_INDEX
    return (ce * mask).sum() / mask.sum().clamp(min=1)


def random_label_loss(logits: Tensor, labels: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """RLabel forget term: NLL towards uniformly random vocabulary tokens at the answer positions.

    The LACUNA/OpenUnlearning sources do not define random-label unlearning for generative QA; this is the
    token-level reading (fresh labels every call, drawn from ``generator`` on the CPU for reproducibility).
    """
    random = torch.randint(0, logits.shape[-1], labels.shape, generator=generator).to(labels.device)
    return nll_loss(logits, torch.where(labels == IGNORE_INDEX, labels, random))


def dpo_loss(
    win_logp: Tensor,
    win_ref_logp: Tensor,
    lose_logp: Tensor,
    lose_ref_logp: Tensor,
    beta: float = 0.1,
    openunlearning_scale: bool = False,
) -> Tensor:
    """DPO: −mean log σ(β·[(log π_θ − log π_ref)(win) − (log π_θ − log π_ref)(lose)]) over sequences.

    Inputs are per-sequence log-probabilities (−ℓ, :func:`token_nll`). ``openunlearning_scale`` multiplies by
    2/β as OpenUnlearning's ``DPO`` trainer does (docs/definitions.md#openunlearning-conventions: a non-standard scale).
    """
    margin = (win_logp - win_ref_logp.detach()) - (lose_logp - lose_ref_logp.detach())
    loss = -F.logsigmoid(beta * margin).mean()
    return loss * (2.0 / beta) if openunlearning_scale else loss


# ---------------------------------------------------------------- retain losses (docs/definitions.md#unlearning-losses)


def kl_retain_loss(logits: Tensor, ref_logits: Tensor) -> Tensor:
    """KL retain term: KL(p_ref ‖ p_θ) averaged over ALL B·T positions (prompt, answer, padding).

    ``kl_div(log_q, log_p_ref, reduction='batchmean', log_target=True)`` on logits flattened to
    [B·T, V], unshifted and unmasked, as OpenUnlearning ``compute_kl_divergence``.
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} differ")
    vocab = logits.shape[-1]
    log_q = F.log_softmax(logits.float(), dim=-1).reshape(-1, vocab)
    log_p_ref = F.log_softmax(ref_logits.detach().float(), dim=-1).reshape(-1, vocab)
    return F.kl_div(log_q, log_p_ref, reduction="batchmean", log_target=True)


def retain_loss(
    logits: Tensor,
    labels: Tensor,
    ref_logits: Tensor | None = None,
    kind: RetainKind | str = "nll",
    legacy_unmasked: bool = False,
) -> Tensor:
    """Retain term L_retain: NLL on D_r by default, or KL (docs/definitions.md#unlearning-losses), or JensUn's JSD
    (docs/definitions.md#jensun-objective).

    ``kind``: "nll" (:func:`nll_loss`), "kl" (:func:`kl_retain_loss`, needs ``ref_logits``) or "jsd"
    (:func:`jensun_retain_loss`, needs ``ref_logits``; ``legacy_unmasked`` is passed through).
    Case-insensitive, so OpenUnlearning's "NLL"/"KL" also work.
    """
    k = kind.lower()
    if k == "nll":
        return nll_loss(logits, labels)
    if k not in ("kl", "jsd"):
        raise ValueError(f"unknown retain loss kind {kind!r}; expected 'nll', 'kl' or 'jsd'")
    if ref_logits is None:
        raise ValueError(f"retain loss kind {kind!r} needs ref_logits from the frozen reference model")
    if k == "kl":
        return kl_retain_loss(logits, ref_logits)
    return jensun_retain_loss(logits, ref_logits, labels, legacy_unmasked=legacy_unmasked)


# -------------------------------------------------------------------------- RMU (docs/definitions.md#unlearning-losses)


def rmu_control_vector(d: int, seed: int) -> Tensor:
    """RMU direction u: ``torch.rand(1, 1, d)`` from a seeded ``torch.Generator``, unit L2 norm.

    Deterministic for a given (d, seed), independent of the global RNG. Float32 on CPU; the loss
    casts it to the hidden states' dtype/device. Scale by the steering coefficient c in the loss.
    """
    if d <= 0:
        raise ValueError(f"d must be positive, got {d}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    u = torch.rand(1, 1, d, generator=gen, dtype=torch.float32)
    return u / torch.linalg.vector_norm(u)


def _masked_token_mse(hidden: Tensor, target: Tensor, mask: Tensor | None) -> Tensor:
    """(1/|T_b|)·Σ_t (1/d)‖h_t − target_t‖², averaged over sequences (OpenUnlearning
    ``compute_activation_loss``). ``mask`` [B, T] selects tokens (None = all)."""
    sq = (hidden.float() - target.float()).pow(2).mean(dim=-1)  # [B, T]
    if mask is None:
        mask = torch.ones(sq.shape, dtype=torch.bool, device=sq.device)
    if mask.shape != sq.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match hidden [B, T] {tuple(sq.shape)}")
    m = mask.to(device=sq.device, dtype=sq.dtype)
    counts = m.sum(dim=-1)
    per_seq = (sq * m).sum(dim=-1) / counts.clamp(min=1)
    return _mean_over_nonempty(per_seq, counts)


def rmu_forget_loss(hidden: Tensor, mask: Tensor | None, control_vector: Tensor, coeff: float) -> Tensor:
    """RMU forget term: mean over masked tokens of (1/d)‖h_t − c·u‖², h = layer-ℓ output [B, T, d].

    ``mask`` is the token mask at the hooked layer's positions — OpenUnlearning uses the unshifted
    ``labels != -100`` — or None for all tokens. Token mean per sequence, then mean over sequences
    (equal to the global token mean when all sequences have the same count).
    """
    target = (coeff * control_vector.to(device=hidden.device, dtype=torch.float32)).expand_as(hidden)
    return _masked_token_mse(hidden, target, mask)


def rmu_retain_loss(hidden: Tensor, ref_hidden: Tensor, mask: Tensor | None) -> Tensor:
    """RMU ``EMBED_DIFF`` retain term: mean over masked tokens of (1/d)‖h_θ − h_ref‖²."""
    if hidden.shape != ref_hidden.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ref_hidden {tuple(ref_hidden.shape)} differ")
    return _masked_token_mse(hidden, ref_hidden.detach().to(hidden.device), mask)


# ------------------------------------------------------------------------ JensUn (docs/definitions.md#jensun-objective)


def jsd(p_log: Tensor, q_log: Tensor) -> Tensor:
    """Jensen-Shannon divergence per position from log-probabilities over the last dim.

    JSD(P‖Q) = ½KL(P‖M) + ½KL(Q‖M), M = ½(P+Q), natural log, so 0 ≤ JSD ≤ ln 2; symmetric.
    log M is clamped at 1e-10 (JensUn HEAD retain). ``-inf`` entries (exact zeros) are allowed.
    Returns shape ``p_log.shape[:-1]``.
    """
    p_log = p_log.float().clamp(min=_LOG_FLOOR)
    q_log = q_log.float().clamp(min=_LOG_FLOOR)
    p, q = p_log.exp(), q_log.exp()
    log_m = (0.5 * (p + q)).clamp(min=JSD_LOG_M_EPS).log()
    kl_pm = (p * (p_log - log_m)).sum(dim=-1)
    kl_qm = (q * (q_log - log_m)).sum(dim=-1)
    return 0.5 * (kl_pm + kl_qm)


def _jsd_clamped_probs(p: Tensor, q: Tensor, eps: float = JSD_PROB_EPS) -> Tensor:
    """JSD per position in JensUn's probability-space form: M, P and Q each clamped at ``eps``.

    Mirrors the reference code (M from the unclamped P, Q; then all three clamped). Q may be
    unnormalised (legacy peaked target).
    """
    m = (0.5 * (p + q)).clamp(min=eps)
    p = p.clamp(min=eps)
    q = q.clamp(min=eps)
    kl_pm = (p * (p.log() - m.log())).sum(dim=-1)
    kl_qm = (q * (q.log() - m.log())).sum(dim=-1)
    return 0.5 * (kl_pm + kl_qm)


def _cyclic_targets(mask: Tensor, refusal: Tensor) -> Tensor:
    """Target id τ_((k mod L)+1) at the k-th (0-based) True position of each row of ``mask``."""
    k = mask.long().cumsum(dim=-1) - 1  # 0-based rank of each answer position within its row
    return refusal[k.clamp(min=0) % refusal.numel()]


def jensun_forget_loss(
    logits: Tensor,
    labels: Tensor,
    refusal_ids: Sequence[int],
    legacy_unmasked: bool = False,
) -> Tensor:
    """JensUn forget loss L_F: JSD between p_θ and a one-hot refusal target.

    HEAD (default): after the causal shift, over answer positions T (``labels[:, 1:] != -100``) the
    target at the k-th answer position of each sequence is τ_((k mod L)+1) (refusal ids repeated
    cyclically); p and q clamped at 1e-9; L_F = Σ_b Σ_{t∈T_b} JSD(p_t‖q_t) / (Σ_b |T_b| + 1e-8).

    ``legacy_unmasked=True`` (paper-time commit 925e221): probability 1 on ALL refusal columns at
    every position (unnormalised for L > 1), no shift, no mask — averaged over all B·T positions
    (prompt, answer, padding). ``labels`` is then unused.
    """
    ids = list(refusal_ids)
    if not ids:
        raise ValueError("refusal_ids must contain at least one token id")
    vocab = logits.shape[-1]
    if min(ids) < 0 or max(ids) >= vocab:
        raise ValueError(f"refusal_ids {ids} out of range for vocabulary size {vocab}")
    refusal = torch.tensor(ids, dtype=torch.long, device=logits.device)

    if legacy_unmasked:
        probs = F.softmax(logits.float(), dim=-1)
        peaked = torch.zeros_like(probs)
        peaked[..., refusal] = 1.0
        return _jsd_clamped_probs(probs, peaked).mean()

    s_logits, s_labels = shifted(logits, labels)
    mask = s_labels != IGNORE_INDEX
    targets = _cyclic_targets(mask, refusal)  # [B, T-1]; meaningless where mask is False
    probs = F.softmax(s_logits.float(), dim=-1)
    q = F.one_hot(targets, vocab).to(probs.dtype)
    per_pos = _jsd_clamped_probs(probs, q)
    per_pos = torch.where(mask, per_pos, torch.zeros_like(per_pos))
    return per_pos.sum() / (mask.sum() + 1e-8)


def jensun_retain_loss(
    logits: Tensor,
    ref_logits: Tensor,
    labels: Tensor,
    legacy_unmasked: bool = False,
) -> Tensor:
    """JensUn retain loss L_R: mean JSD(p_ref‖p_θ) against the frozen initial model.

    HEAD (default): after the causal shift, mean over answer positions (``labels[:, 1:] != -100``),
    JSD from log-softmax with log M clamped at 1e-10 (:func:`jsd`); 0 if no position is labelled.
    ``legacy_unmasked=True`` (paper-time): probability-space JSD clamped at 1e-9 over ALL B·T
    positions, unshifted and unmasked. ``labels`` is then unused.
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} differ")
    ref_logits = ref_logits.detach()
    if legacy_unmasked:
        p_ref = F.softmax(ref_logits.float(), dim=-1)
        p = F.softmax(logits.float(), dim=-1)
        return _jsd_clamped_probs(p_ref, p).mean()

    s_logits, s_labels = shifted(logits, labels)
    s_ref = ref_logits[:, :-1, :]
    mask = s_labels != IGNORE_INDEX
    per_pos = jsd(F.log_softmax(s_ref.float(), dim=-1), F.log_softmax(s_logits.float(), dim=-1))
    per_pos = torch.where(mask, per_pos, torch.zeros_like(per_pos))
    return per_pos.sum() / mask.sum().clamp(min=1)


# ------------------------------------------------------------------ combination (docs/definitions.md#unlearning-losses)


def combine(forget: Tensor, retain: Tensor | float | None, gamma: float = 1.0, alpha: float = 1.0) -> Tensor:
    """Total loss γ·L_forget + α·L_retain (every method of the definitions).

    ``retain=None`` (GradAscent) gives γ·L_forget.
    """
    if retain is None:
        return gamma * forget
    return gamma * forget + alpha * retain
