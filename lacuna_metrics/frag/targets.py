"""Which weights of a loaded model FRAG (and FRP, WAGLE, Selective Pruning) score: the targets and their weights.

A target names a set of projections (docs/definitions.md#frag-score); :mod:`lacuna_metrics.weights.anatomy` decides what
each weight is, this module only selects among them and drops those whose input cannot be observed.
See ``docs/anatomy.md`` ("FRAG").
"""

from __future__ import annotations

import re

import torch

from lacuna_metrics.weights.anatomy import Weight, is_linear_module, linear_weights, model_anatomy

__all__ = [
    "ALL_PROJECTIONS",
    "FRAG_TARGETS",
    "MLP_PROJECTIONS",
    "FRP_TARGETS",
    "check_target",
    "frag_weights",
    "linear_frag_weights",
    "linear_weight_names",
    "transposed_weight_names",
]

#: The seven projections of a Llama-style block: what ``all`` selects there (docs/definitions.md#frag-score).
ALL_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: What ``mlp`` (FRP's scope) selects in a Llama-style block.
MLP_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
#: FRAG targets: ``all``: every projection of every block (attention, MLP, experts, routers); ``attention``;
#: ``mlp``: MLP and expert projections; ``expert``: MoE experts only; ``linear``: every ``nn.Linear`` / ``Conv1D``
#: except ``lm_head`` and embeddings. Also ``regex:PATTERN``: the projections whose tensor name ``re.search``
#: matches (checkpoint names in :func:`lacuna_metrics.frag.activations.activation_stats`, parameter names elsewhere).
#: See docs/anatomy.md.
FRAG_TARGETS: tuple[str, ...] = ("all", "attention", "mlp", "expert", "linear")
#: The targets of the FRAG code (docs/definitions.md#frag-score), the ones FRP accepts (not the localization
#: targets, :data:`lacuna_metrics.localization.auc.TARGETS`).
FRP_TARGETS: tuple[str, ...] = ("all", "mlp", "linear")


def check_target(target: str) -> str:
    """Validate a FRAG target (see :data:`FRAG_TARGETS`); ValueError naming it otherwise."""
    if not isinstance(target, str):
        raise ValueError(f"unknown target {target!r}; expected one of {list(FRAG_TARGETS)} or regex:PATTERN")
    if target.startswith("regex:"):
        try:
            re.compile(target.removeprefix("regex:"))
        except re.error as exc:
            raise ValueError(f"target {target!r}: invalid regular expression: {exc}") from None
        return target
    if target not in FRAG_TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {list(FRAG_TARGETS)} or regex:PATTERN")
    return target


def _can_compute_mid(module: torch.nn.Module) -> bool:
    """Whether a fused experts module exposes what :func:`lacuna_metrics.frag.activation_norms._expert_mid` needs to
    rebuild the down projection's input (the two must agree)."""
    params = dict(module.named_parameters(recurse=False))
    has_up = "gate_up_proj" in params or "up_proj" in params
    return has_up and callable(getattr(module, "act_fn", None))


def _frag_plan(model: torch.nn.Module, target: str) -> tuple[list[Weight], dict[str, str]]:
    """The weights to measure for ``target`` and the block weights left out (name -> reason)."""
    check_target(target)
    if target == "linear":
        return linear_weights(model), {}
    anatomy = model_anatomy(model)
    chosen: list[Weight] = []
    skipped: dict[str, str] = {}
    modules = dict(model.named_modules())
    for weight in anatomy.select(target):
        if (
            weight.hook == "experts"
            and weight.role in ("down", "fc_out")
            and not _can_compute_mid(modules[weight.module])
        ):
            skipped[weight.name] = "fused experts module without gate_up_proj/up_proj and act_fn (input not computable)"
        elif weight.hook in ("linear", "experts"):
            chosen.append(weight)
        else:
            skipped[weight.name] = "no module whose input can be observed"
    return chosen, skipped


def frag_weights(model: torch.nn.Module, target: str = "all") -> list[Weight]:
    """The weights FRAG scores in a loaded ``model`` for ``target``, in model order (see :data:`FRAG_TARGETS`).

    Raises ValueError when the target is unknown, the model's blocks cannot be found
    (:func:`lacuna_metrics.weights.anatomy.model_anatomy`) or the target selects nothing.
    """
    chosen, _ = _frag_plan(model, target)
    if not chosen:
        who = type(model).__name__
        if target == "linear":
            raise ValueError(f"target='linear' found no nn.Linear / Conv1D modules in {who}")
        raise ValueError(f"target={target!r} matches no projection weight of {who} ({model_anatomy(model).summary()})")
    return chosen


def linear_weight_names(model: torch.nn.Module, target: str = "all") -> dict[str, str]:
    """Map each scored ``nn.Linear`` / ``Conv1D`` module to its weight's parameter name, in model order.

    ``all``: every linear projection of every block (the seven q/k/v/o/gate/up/down on Llama-style models,
    docs/definitions.md#frag-score; fused ``qkv`` / ``gate_up``, GPT-2 ``Conv1D``, per-expert modules elsewhere);
    ``attention``; ``mlp``: MLP and expert projections; ``linear``: every ``nn.Linear`` and transformers ``Conv1D``
    except ``lm_head`` and embeddings. Fused 3-D expert parameters and non-linear router modules are not modules with a
    2-D weight and are left out here (:func:`frag_weights` has them). Raises ValueError when nothing matches.
    """
    names = {w.module: w.name for w in linear_frag_weights(model, target)}
    if not names:
        raise ValueError(f"target={target!r} matches no nn.Linear / Conv1D projection of {type(model).__name__}")
    return names


def linear_frag_weights(model: torch.nn.Module, target: str = "all") -> list[Weight]:
    """The weight matrices of :func:`frag_weights` held by an ``nn.Linear`` / ``Conv1D`` module (not fused 3-D
    experts or non-linear routers), in model order: what :func:`linear_weight_names` names and Selective Pruning
    zeroes channels of."""
    modules = dict(model.named_modules())
    return [
        w
        for w in frag_weights(model, target)
        if w.hook == "linear" and w.name.endswith(".weight") and is_linear_module(modules[w.module])
    ]


def transposed_weight_names(model: torch.nn.Module, target: str = "all") -> set[str]:
    """Names of the scored weights stored with the input axis first: transformers ``Conv1D`` (GPT-2),
    ``(d_in, d_out)``, and fused experts stored ``[E, d_in, d_out]``.

    FRAG broadcasts x over the input axis, which for these weights is the row axis, not the column axis.
    """
    return {w.name for w in frag_weights(model, target) if w.transposed}
