"""Selective Pruning (SP) -- training-free, neuron level (Pochinkov & Schoots 2024, "Dissecting language models:
machine unlearning via selective pruning"; the baseline of FRAG's Table 1, docs/definitions.md#selective-pruning).

For every MLP hidden neuron j (an input channel of the down projection) of every block:

1. importance on forget text I^f_j and on retain text I^r_j, measured on the ORIGINAL model;
2. score s_j = I^f_j / (I^r_j + eps);
3. the top ``frac`` of neurons by s are removed: the down projection's column j is zeroed and, in the default
   ``mode="neuron"``, also output channel j of ``gate_proj`` / ``up_proj`` (or ``fc_in``), with its bias entry.

Sources, read for understanding: ``nickypro/taker`` (``scoring.py`` ``score_indices_by_abs``: cripple / (focus +
eps) on the mean |activation| of the MLP's pre-output, i.e. the down projection's input; ``activations.py``
``get_top_frac``: one top-k over the (layers x neurons) score tensor, ``ff_frac`` 0.1, ``ff_eps`` 1e-3) and FRAG's
re-implementation used for its Table 1 (``Yi1-Chen/FRAG`` ``baselines/selective_pruning.py --scoring
activation_ratio --mlp_frac 0.05``: forget / (retain + 1e-5) of the mean |up_proj output|, a global top-k, and
gate rows, up rows and down columns set to zero).

Choices (INFERRED / deviations; every one is a configurable default):

* Statistic: OUR x_j of the down projection's input from :mod:`lacuna_metrics.frag.activations` -- per calibration
  sequence the L2 norm of neuron j's activation over its tokens, averaged over sequences -- instead of the mean
  |activation| over tokens. It is the same tensor taker scores (the neuron's output, act(gate) * up), measured
  with FRAG/FRP's hooks and cache, so SP, FRP and FRAG share one cached pass (same texts, ``max_length``, bf16).
  DEVIATION: an L2 instead of an L1 aggregate over tokens; a common per-side factor (e.g. sequence length)
  scales every neuron alike and does not change the ranking. FRAG's up_proj output is not used.
* ``eps = 1e-5`` (FRAG's baseline, whose numbers FRAG's paper reports; taker's default is 1e-3).
* ``frac = 0.05`` (FRAG's ``--mlp_frac`` default and Table 1 setting; taker's default is 0.1).
* ``scope = "global"``: one top-k over all blocks' neurons (taker and FRAG); ``per_layer``: ``int(frac * d_mlp)``
  in each block.
* Ties: exactly ``k`` neurons are pruned, equal scores go to the earlier (block, neuron) first; FRAG's
  ``>= threshold`` would prune every tied neuron, taker's ``topk`` breaks ties arbitrarily.
* ``mode = "neuron"`` (FRAG's baseline: gate/up rows and down column zeroed -- a dead neuron that gradient
  fine-tuning cannot revive, since every gradient through it is zero); ``mode = "down"`` zeroes only the down
  column (taker's output mask; the neuron's contribution is equally gone, but relearnable).
* Architectures: every MLP the model anatomy (:mod:`lacuna_metrics.weights.anatomy`, docs/anatomy.md) finds with an
  ``nn.Linear`` or ``Conv1D`` output projection (role ``down`` / ``fc_out``: Llama's ``down_proj``, GPT-2's
  ``c_proj``, GPT-NeoX / Falcon / BLOOM's ``dense_4h_to_h``, OPT's ``fc2``); the projections of the same MLP that
  produce its neurons (``gate`` / ``up`` / ``fc_in``, Phi-3's fused ``gate_up`` as two halves) are zeroed with
  their bias entries. Fused 3-D expert tensors (Mixtral in transformers 5) are not pruned; a model with no such
  MLP raises a ValueError.
* ``restrict=`` and LoRA do not apply (no training; ``lacuna_unlearn.trainer.app._run_editor`` refuses them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lacuna_metrics import MLP_NEURON_ROLES, MLP_OUTPUT_ROLES, Weight, linear_frag_weights
from lacuna_unlearn.methods.frp import _is_real, prune_from_activations, run_on_qa_rows
from lacuna_unlearn.methods.settings import SP_EPS, SPSettings
from lacuna_unlearn.methods.wagle import top_fraction_masks

__all__ = [
    "EPS",
    "MODES",
    "SCOPES",
    "Projection",
    "SPConfig",
    "apply_selective_pruning",
    "mlp_neurons",
    "run_from_config",
    "run_selective_pruning",
    "sp_prune_masks",
    "sp_scores",
]

#: FRAG's baseline eps in s_j = I^f_j / (I^r_j + eps).
EPS = SP_EPS
SCOPES: tuple[str, ...] = ("global", "per_layer")
MODES: tuple[str, ...] = ("neuron", "down")


@dataclass
class SPConfig(SPSettings):
    """Selective Pruning's settings (:class:`lacuna_unlearn.methods.settings.SPSettings`; defaults: FRAG's Table 1
    baseline, see the module docstring) plus the run's ``seed``, checked."""

    seed: int = 42

    def validate(self) -> SPConfig:
        """Raise ValueError naming the offending field; return self."""
        if not _is_real(self.frac) or not 0.0 <= self.frac < 1.0:
            raise ValueError(f"SPConfig.frac must be in [0, 1), got {self.frac!r}")
        if not _is_real(self.eps) or not math.isfinite(self.eps) or self.eps <= 0:
            raise ValueError(f"SPConfig.eps must be a finite number > 0, got {self.eps!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"SPConfig.scope: unknown scope {self.scope!r}; expected one of {list(SCOPES)}")
        if self.mode not in MODES:
            raise ValueError(f"SPConfig.mode: unknown mode {self.mode!r}; expected one of {list(MODES)}")
        for name in ("calib_samples", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SPConfig.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"SPConfig.seed must be an integer, got {self.seed!r}")
        return self


# -- scoring ---------------------------------------------------------------------------------------------------


def _vector(x: torch.Tensor, field: str, d: int | None = None) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dim() != 1 or (d is not None and x.numel() != d):
        want = f"length {d}" if d is not None else "1-D"
        raise ValueError(f"{field}: expected a {want} vector of neuron statistics, got shape {tuple(x.shape)}")
    x = x.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(x).all()) or bool((x < 0).any()):
        raise ValueError(f"{field}: neuron statistics must be finite and >= 0")
    return x


def sp_scores(x_forget: torch.Tensor, x_retain: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """s_j = I^f_j / (I^r_j + eps) per neuron (float64): high = active on forget text, quiet on retain text."""
    if not _is_real(eps) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    xf = _vector(x_forget, "x_forget")
    xr = _vector(x_retain, "x_retain", xf.numel())
    return xf / (xr + eps)


def sp_prune_masks(
    x_forget: Mapping[str, torch.Tensor], x_retain: Mapping[str, torch.Tensor], cfg: SPConfig
) -> dict[str, torch.Tensor]:
    """Bool vector per down-projection weight name (True = prune that neuron), in ``x_forget``'s order.

    ``global``: exactly ``int(frac * total neurons)`` over all layers; ``per_layer``: ``int(frac * d_mlp)`` each.
    Ties go to the earlier (layer, neuron). ``x_retain`` must have the same keys and lengths.
    """
    cfg.validate()
    scores = {}
    for name, xf in x_forget.items():
        if name not in x_retain:
            raise ValueError(f"x_retain: no neuron statistics for {name!r}")
        scores[name] = sp_scores(xf, x_retain[name], cfg.eps)
    return top_fraction_masks(scores, cfg.frac, "global" if cfg.scope == "global" else "per_tensor")


# -- models ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """A projection SP zeroes channels of: ``axis`` is the weight's dimension indexed by neuron (``nn.Linear``
    stores ``(d_out, d_in)``, a transposed ``Conv1D`` ``(d_in, d_out)``); ``copies``: 2 for a fused gate_up;
    ``bias``: the bias is indexed by neuron too (the projections that produce the neurons)."""

    name: str
    module: torch.nn.Module
    axis: int
    copies: int = 1
    bias: bool = False

    def zero(self, neurons: torch.Tensor) -> list[str]:
        """Zero the channels of ``neurons`` (indices); return the tensor names changed."""
        weight = self.module.weight
        d = weight.shape[self.axis] // self.copies
        idx = torch.cat([neurons + c * d for c in range(self.copies)]).to(weight.device)
        weight.index_fill_(self.axis, idx, 0.0)
        zeroed = [f"{self.name}.weight"]
        bias = getattr(self.module, "bias", None)
        if self.bias and isinstance(bias, torch.Tensor):
            bias.index_fill_(0, idx.to(bias.device), 0.0)
            zeroed.append(f"{self.name}.bias")
        return zeroed


def mlp_neurons(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Every MLP whose hidden neurons SP can prune, keyed by its output projection's weight name, in model order:
    ``{"down": Projection (input channels), "inputs": [Projection (output channels) of the gate / up / fc_in of the
    same MLP], "d_mlp": n}``. Which weight plays which role is :mod:`lacuna_metrics.weights.anatomy`'s answer, so every
    architecture it knows with ``nn.Linear`` or ``Conv1D`` MLPs is covered; fused 3-D expert tensors are not."""
    modules = dict(model.named_modules())
    by_mlp: dict[str, list[Weight]] = {}
    for w in linear_frag_weights(model, "mlp"):
        by_mlp.setdefault(w.module.rpartition(".")[0], []).append(w)
    out: dict[str, dict[str, Any]] = {}
    for parent, weights in by_mlp.items():
        downs = [w for w in weights if w.role in MLP_OUTPUT_ROLES]
        if len(downs) > 1:
            raise ValueError(f"Selective Pruning: MLP {parent!r} has {len(downs)} output projections")
        if not downs:
            continue
        down = downs[0]
        d_mlp = int(down.input_dim)
        inputs = []
        for w in weights:
            copies = 1 if w.role in MLP_NEURON_ROLES else 2 if w.role == "gate_up" else 0
            if not copies:
                continue
            axis = 1 if w.transposed else 0
            if int(w.shape[axis]) != copies * d_mlp:
                raise ValueError(f"{w.name} has {w.shape[axis]} outputs, {down.name} {d_mlp} inputs (x{copies})")
            inputs.append(Projection(w.module, modules[w.module], axis, copies, bias=True))
        output = Projection(down.module, modules[down.module], 0 if down.transposed else 1)
        out[down.name] = {"down": output, "inputs": inputs, "d_mlp": d_mlp}
    if not out:
        raise ValueError(
            f"Selective Pruning found no MLP output projection (roles {list(MLP_OUTPUT_ROLES)}, nn.Linear or Conv1D; "
            f"docs/anatomy.md) in {type(model).__name__}"
        )
    return out


def apply_selective_pruning(
    model: torch.nn.Module,
    x_forget: Mapping[str, torch.Tensor],
    x_retain: Mapping[str, torch.Tensor],
    cfg: SPConfig,
) -> dict[str, Any]:
    """Prune ``model`` in place. ``x_forget`` / ``x_retain`` map weight names to input statistics (as
    :func:`lacuna_metrics.frag.activations.collect_input_norms` returns them); only the down projections' entries are
    used. Returns ``{"pruned": {down weight: count}, "pruned_total", "neurons_total", "neurons": {down weight:
    [indices]}, "zeroed": [tensor names]}``."""
    cfg.validate()
    mlps = mlp_neurons(model)
    for name, info in mlps.items():
        for side, xs in (("x_forget", x_forget), ("x_retain", x_retain)):
            if name not in xs:
                raise ValueError(f"{side}: no activation statistics for {name!r}")
            _vector(xs[name], f"{side}[{name!r}]", info["d_mlp"])
    masks = sp_prune_masks({n: x_forget[n] for n in mlps}, {n: x_retain[n] for n in mlps}, cfg)
    zeroed: list[str] = []
    with torch.no_grad():
        for name, info in mlps.items():
            neurons = masks[name].nonzero().squeeze(1)
            if not neurons.numel():
                continue
            zeroed += info["down"].zero(neurons)
            if cfg.mode == "neuron":
                for projection in info["inputs"]:
                    zeroed += projection.zero(neurons)
    pruned = {n: int(m.sum()) for n, m in masks.items()}
    return {
        "pruned": pruned,
        "pruned_total": sum(pruned.values()),
        "neurons_total": sum(info["d_mlp"] for info in mlps.values()),
        "neurons": {n: m.nonzero().squeeze(1).tolist() for n, m in masks.items()},
        "zeroed": zeroed,
    }


def run_selective_pruning(
    model_dir: str | os.PathLike[str],
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    out_dir: str | os.PathLike[str],
    cfg: SPConfig | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """SP end to end: statistics of the original model on the first ``cfg.calib_samples`` texts per side (bf16,
    cached with FRP/FRAG's fingerprint in ``cache_dir``), prune, save model + tokenizer + ``unlearn_manifest.json``
    to ``out_dir`` (built in ``<out_dir>.partial``, renamed at the end; an existing ``out_dir`` is an error)."""
    cfg = (cfg or SPConfig()).validate()
    return prune_from_activations(
        model_dir,
        forget_texts,
        retain_texts,
        out_dir,
        cfg,
        target="mlp",
        apply=apply_selective_pruning,
        result_keys=("pruned", "pruned_total", "neurons_total", "neurons", "zeroed"),
        describe={
            "method": "selective_pruning",
            "spec": (
                "docs/definitions.md#selective-pruning (Pochinkov & Schoots 2024; FRAG baselines/selective_pruning.py)"
            ),
            "statistic": (
                "x_j of the MLP output projection's input (down_proj, c_proj, dense_4h_to_h, fc2): mean over "
                "sequences of the per-sequence L2 norm over tokens"
            ),
        },
        cache_dir=cache_dir,
    )


def run_from_config(
    model: str | os.PathLike[str],
    forget_rows: Sequence[Mapping[str, Any]],
    retain_rows: Sequence[Mapping[str, Any]],
    out: str | os.PathLike[str],
    args: Mapping[str, Any],
    *,
    seed: int = 42,
    data: Any = None,
) -> Path:
    """``lacuna-unlearn method=selective_pruning``: the forget/retain QA text is the calibration text, as FRP's
    (so both share the cached statistics); ``method.args`` = :class:`SPConfig`."""
    return run_on_qa_rows(
        "selective_pruning", SPConfig, run_selective_pruning, model, forget_rows, retain_rows, out, args, seed=seed
    )
