"""WAGLE -- Weight Attribution-Guided LLM unLEarning (Jia et al., NeurIPS 2024, arXiv 2410.17509).

WAGLE first *locates* the weights that matter for unlearning, then runs an ordinary unlearning objective
(GradDiff or NPO in the paper) on those weights only. Sources: the paper, and the mask generator of the
authors' code (``OPTML-Group/WAGLE`` ``src/unlearn/generate_mask.py``, score type ``snip_advanced``, and the
gradient masking in ``src/unlearn/base.py``; read through the public copy ``Zodiark-ch/CSAT``, which carries
WAGLE's README and ``src/``, since the original repository is not in our index).

Attribution score, one per scalar i (the code's ``snip_advanced``; the paper's closed form from the implicit
gradient of the bi-level problem, with the Hessian diagonal approximated by the constant mu)::

    S_i = | (theta_i - g_r,i / mu) * g_f,i |

* ``g_f`` = sum over forget batches of the gradient of the mean answer-token NLL on the batch; ``g_r`` the same
  on retain batches (the code's ``compute_loss_adapted``: plain NLL on either side, whatever the unlearning
  objective; the absolute value makes the sign of the forget loss irrelevant).
* The ``ratio`` fraction of scalars with the LARGEST S is kept trainable (the code ranks ``-|...|`` ascending
  and keeps ranks ``< int(N * ratio)``; the README: "``tofu_0.8.pt`` ... 80% weights are selected for
  unlearning"). The trainer freezes the rest with gradient hooks and verifies after training that it did not move.
* The objective on the located weights is :class:`GradDiff` or :class:`NPO` (``objective=``), reused unchanged.

Choices the sources leave open or that we changed (INFERRED; every one is a configurable default):

* ``ratio = 0.8``: INFERRED from the README's example mask (80% of the weights selected); a hyper-parameter.
* ``mu = 1e-6``: INFERRED from the ``unlearn.mu`` default ("hessian approximation parameter") of the public
  fork; the paper treats it as a hyper-parameter. With a small mu the retain-gradient term dominates.
* Candidates (``target``): the code scores every parameter (embeddings and norms included). Default here:
  ``linear`` = every linear weight inside the transformer blocks (no embeddings, ``lm_head``, norms or biases),
  which is where LACUNA's masks live; ``all`` / ``mlp`` = the seven projections / gate-up-down;
  ``params`` = every trainable parameter, as the authors' code. Non-candidates are frozen.
* ``scope = global``: one top-k over all candidate scalars, as the code's ``score2mask`` (its ``layer_wise``
  variant = ``per_tensor``: top ``int(ratio * numel)`` of each tensor).
* Ties: exactly ``k = int(ratio * N)`` scalars are selected; equal scores at the threshold go to the earlier
  scalar in (parameter order, row-major index) order. The code's unstable ``argsort`` breaks them arbitrarily.
* Data: one pass over the forget set in order, in batches of ``batch_size``; the retain gradient uses the same
  number of retain items (retain item ``i mod |D_r|`` for forget item i), as the code pairs one random retain
  item with every forget item. Gradients are taken in eval mode (no dropout), accumulated in float32.
* LoRA: refused. WAGLE's masks select base-model scalars, but with LoRA only the adapters train and the base
  weights are frozen, so a base-weight mask has nothing to act on (and LoRA's B matrices start at zero, so an
  attribution of the adapters themselves is degenerate). ``restrict=`` composes: the trainer ANDs it with the located mask.

The score and the selection are pure functions (:func:`attribution_scores`, :func:`top_fraction_masks`), tested
on hand-made tensors; :func:`top_fraction_masks` is also Selective Pruning's neuron selection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lacuna_unlearn.methods.base import Method, summed_nll_gradients
from lacuna_unlearn.methods.grad_diff import GradDiff
from lacuna_unlearn.methods.npo import NPO
from lacuna_unlearn.methods.settings import WAGLESettings

__all__ = [
    "CANDIDATES",
    "OBJECTIVES",
    "SCOPES",
    "WAGLE",
    "attribution_scores",
    "candidate_parameters",
    "top_fraction_masks",
]

OBJECTIVES: dict[str, type[GradDiff]] = {"grad_diff": GradDiff, "npo": NPO}
#: ``target`` values: which parameters may be located (see the module docstring).
CANDIDATES: tuple[str, ...] = ("linear", "all", "mlp", "params")
SCOPES: tuple[str, ...] = ("global", "per_tensor")


# -- pure functions ------------------------------------------------------------------------------------------


def attribution_scores(
    weight: torch.Tensor, grad_forget: torch.Tensor, grad_retain: torch.Tensor, mu: float
) -> torch.Tensor:
    """WAGLE's attribution S = |(theta - g_r / mu) * g_f| per scalar (float32, shape of ``weight``).

    Large S = the scalar both matters for the forget loss and sits where the retain loss tolerates a change
    (implicit-gradient closed form, Hessian diagonal ~ mu). Non-finite inputs are an error, not a silent NaN.
    """
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu > 0):
        raise ValueError(f"mu must be a finite number > 0, got {mu!r}")
    shape = tuple(weight.shape)
    for name, g in (("grad_forget", grad_forget), ("grad_retain", grad_retain)):
        if tuple(g.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(g.shape)}, the weight {shape}")
    w = weight.detach().float()
    s = ((w - grad_retain.detach().float().to(w.device) / mu) * grad_forget.detach().float().to(w.device)).abs()
    if not bool(torch.isfinite(s).all()):
        raise ValueError("attribution scores are not finite (NaN/inf weights or gradients)")
    return s


def _top_k_flat(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of exactly ``k`` largest entries of a 1-D tensor; ties at the threshold go to lower indices."""
    n = flat.numel()
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=flat.device)
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=flat.device)
    threshold = torch.kthvalue(flat, n - k + 1).values  # the k-th largest value
    selected = flat > threshold
    missing = k - int(selected.sum())
    if missing > 0:
        ties = (flat == threshold).nonzero().squeeze(1)[:missing]
        selected[ties] = True
    return selected


def top_fraction_masks(
    scores: Mapping[str, torch.Tensor], fraction: float, scope: str = "global"
) -> dict[str, torch.Tensor]:
    """Bool masks (True = selected) of the largest ``fraction`` of the scores, in each tensor's shape.

    ``global``: exactly ``int(fraction * N)`` of all N scalars; ``per_tensor``: ``int(fraction * numel)`` of each.
    Ties at the threshold go to the earlier scalar (``scores`` order, then row-major index), so the result is
    deterministic. Scores must be finite.
    """
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")
    for name, s in scores.items():
        if not bool(torch.isfinite(s).all()):
            raise ValueError(f"scores for {name!r} are not finite")
    if scope != "global":
        return {n: _top_k_flat(s.reshape(-1), int(fraction * s.numel())).reshape(s.shape) for n, s in scores.items()}
    if not scores:
        return {}
    device = next(iter(scores.values())).device
    dtype = next(iter(scores.values())).dtype
    for s in scores.values():
        dtype = torch.promote_types(dtype, s.dtype)  # float32 scores stay float32: N can be 10^9
    flat = torch.cat([s.detach().reshape(-1).to(device=device, dtype=dtype) for s in scores.values()])
    selected = _top_k_flat(flat, int(fraction * flat.numel()))
    out, start = {}, 0
    for name, s in scores.items():
        out[name] = selected[start : start + s.numel()].reshape(s.shape).to(s.device)
        start += s.numel()
    return out


# -- model side ----------------------------------------------------------------------------------------------


def candidate_parameters(model: torch.nn.Module, target: str = "linear") -> dict[str, torch.nn.Parameter]:
    """The trainable parameters WAGLE may locate, by name, in model order (see ``target`` in the module doc)."""
    from lacuna_metrics import linear_weight_names

    if target not in CANDIDATES:
        raise ValueError(f"target must be one of {list(CANDIDATES)}, got {target!r}")
    params = dict(model.named_parameters())
    if target == "params":
        names = list(params)
    else:
        names = [n for n in linear_weight_names(model, target).values() if n in params]
    out = {n: params[n] for n in names if params[n].requires_grad}
    if not out:
        raise ValueError(f"WAGLE target={target!r}: no trainable candidate parameters in {type(model).__name__}")
    return out


@dataclass
class WAGLE(WAGLESettings, Method):
    """WAGLE: the ``objective`` (GradDiff or NPO) on the ``ratio`` most attributed scalars (module docstring;
    hyper-parameters: :class:`lacuna_unlearn.methods.settings.WAGLESettings`)."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"WAGLE.objective must be one of {sorted(OBJECTIVES)}, got {self.objective!r}")
        if not (isinstance(self.ratio, (int, float)) and not isinstance(self.ratio, bool) and 0 < self.ratio <= 1):
            raise ValueError(f"WAGLE.ratio must be in (0, 1], got {self.ratio!r}")
        if not (isinstance(self.mu, (int, float)) and not isinstance(self.mu, bool)):
            raise ValueError(f"WAGLE.mu must be a finite number > 0, got {self.mu!r}")
        if not (math.isfinite(self.mu) and self.mu > 0):
            raise ValueError(f"WAGLE.mu must be a finite number > 0, got {self.mu!r}")
        if self.target not in CANDIDATES:
            raise ValueError(f"WAGLE.target must be one of {list(CANDIDATES)}, got {self.target!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"WAGLE.scope must be one of {list(SCOPES)}, got {self.scope!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"WAGLE.batch_size must be an integer >= 1, got {self.batch_size!r}")
        kwargs: dict[str, Any] = {"gamma": self.gamma, "alpha": self.alpha, "retain_loss_type": self.retain_loss_type}
        if self.objective == "npo":
            kwargs["beta"] = self.beta
        try:
            self._objective = OBJECTIVES[self.objective](**kwargs)  # not a field: stays out of asdict()
        except ValueError as exc:
            raise ValueError(f"WAGLE: {exc}") from None
        self.location: dict[str, Any] | None = None  # summary of the last locate() call

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return self._objective.needs_reference

    def loss(self, model, inputs, ref_model):  # noqa: ANN001, ANN201 - see Method.loss
        return self._objective.loss(model, inputs, ref_model)

    def locate(
        self,
        model: torch.nn.Module,
        forget: torch.utils.data.Dataset,
        retain: torch.utils.data.Dataset | None,
        collate: Callable[[list[Any]], dict[str, Any]],
    ) -> dict[str, torch.Tensor | None]:
        """Keep masks of the top-``ratio`` attributed scalars of the candidate parameters (others frozen)."""
        lora = [n for n, _ in model.named_parameters() if "lora_" in n]
        if lora:
            raise ValueError(
                "WAGLE does not combine with LoRA: its masks select base-model weights, which LoRA freezes "
                f"(adapter parameters found, e.g. {lora[0]!r}); run WAGLE without lora.enabled"
            )
        if retain is None or len(retain) == 0:
            raise ValueError("WAGLE needs retain data: its attribution score uses the retain gradient")
        params = candidate_parameters(model, self.target)
        forget_items = [forget[i] for i in range(len(forget))]
        retain_items = [retain[i % len(retain)] for i in range(len(forget))]
        g_f = summed_nll_gradients(model, forget_items, collate, params, self.batch_size)
        g_r = summed_nll_gradients(model, retain_items, collate, params, self.batch_size)
        scores = {n: attribution_scores(p, g_f[n], g_r[n], self.mu) for n, p in params.items()}
        del g_f, g_r
        masks = top_fraction_masks(scores, self.ratio, self.scope)
        selected = sum(int(m.sum()) for m in masks.values())
        total = sum(m.numel() for m in masks.values())
        if selected == 0:
            raise ValueError(f"WAGLE.ratio={self.ratio} selects no scalar of the {total} candidates")
        self.location = {
            "candidates": len(masks),
            "candidate_scalars": total,
            "selected_scalars": selected,
            "selected_per_parameter": {n: int(m.sum()) for n, m in masks.items()},
        }
        return {n: m.to(params[n].device) for n, m in masks.items()}
