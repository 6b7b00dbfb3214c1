"""Restrict any gradient-based unlearning method to a subset of scalars (OracleGrad and friends).

OracleGrad (``docs/definitions.md#oraclegrad``) is GradDiff restricted to the forget mask
:math:`M_F`: backward hooks multiply each parameter's gradient by :math:`M_F`, and parameters outside
every mask get ``requires_grad=False``. With weight decay 0 and zero initial moments, Adam never
moves an out-of-mask scalar, so those scalars stay *bit-identical*.

Usage::

    restriction = parse_restriction("forget_mask")            # or "groups:0,2", "regex:mlp", "none"
    resolved = restriction.resolve(model, masks)              # {name: bool mask | None}
    handle = apply_restriction(model, resolved)               # freeze + gradient hooks
    optimizer = torch.optim.AdamW(param_groups(model, resolved, weight_decay=0.01), lr=1e-4)
    check_optimizer(optimizer, model, resolved)               # optional guard
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ...train (plain loop or ``Trainer(optimizers=(optimizer, None))``)...
    assert verify_unchanged(before, model, resolved) == []
    handle.remove()                                           # hooks gone, requires_grad restored

**Weight decay must be 0 for restricted parameters.** Decoupled weight decay (AdamW) shrinks every
scalar of a parameter, even where the gradient is zero. Build the optimizer with :func:`param_groups`,
which gives restricted parameters ``weight_decay=0`` and the rest the decay you ask for. Do not pass
``model.parameters()`` to ``torch.optim.AdamW``: its default ``weight_decay`` is 0.01. Do not let HF
``Trainer`` build its own optimizer when ``args.weight_decay > 0``. For the same reason, the
optimizer must start with zero moments for restricted parameters: a fresh optimizer, or one that
:func:`check_optimizer` accepts.

The hooks zero out-of-mask gradient entries with ``torch.where``. On finite gradients this equals
multiplying by the mask. Unlike multiplication, it also turns an inf/NaN gradient outside the mask
into 0 (``0 * inf`` is NaN), so such a value cannot poison Adam's moments for frozen scalars.

Hooks are tensor hooks on the leaf parameters (``param.register_hook``). They mask every backward
contribution before it is accumulated, so gradient accumulation, gradient clipping, AMP unscaling and
DDP all see masked gradients.

Sharded parameters (FSDP) never receive those hooks' gradients: FSDP swaps the parameters for new ones
and writes the reduce-scattered gradient into them directly. FSDP2 (``fully_shard``) keeps each
parameter as a DTensor under its own name, so :func:`shard_masks` cuts every mask to the rank's local
shard (the DTensor's own placements) and :func:`mask_gradients` zeroes the local gradient after each
backward, before clipping and the optimizer step; :func:`verify_unchanged` compares full tensors
(``DTensor.full_tensor``, a collective: call it on every rank). FSDP1 flattens parameters into
FlatParameters, where masks would have to follow FSDP's private flat layout: not supported (the
trainer refuses a restriction under FSDP1 before training). See ``docs/distributed.md``.

The testbed builder's :func:`lacuna_unlearn.testbed.injection.mask_gradients` does the same masking for one
group *after* backward; this module does it for any restriction with hooks, so it works inside
third-party trainers without overriding ``training_step``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from lacuna_metrics import MAX_GROUPS, MaskSet

__all__ = [
    "Restriction",
    "RestrictionError",
    "RestrictionHandle",
    "apply_restriction",
    "check_optimizer",
    "exempt_from_decay",
    "param_groups",
    "intersect",
    "parse_restriction",
    "mask_gradients",
    "restriction_stats",
    "shard_masks",
    "verify_unchanged",
]

Resolved = dict[str, "torch.Tensor | None"]
_Kind = Literal["none", "forget_mask", "groups", "regex"]
_SPEC_HELP = "expected 'forget_mask', 'groups:<g>[,<g>...]', 'regex:<pattern>' or 'none'"


class RestrictionError(ValueError):
    """An invalid restriction spec, or one that does not fit the model or masks. The message names the tensor."""


# --------------------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True)
class Restriction:
    """Which scalars an unlearning method may update. Build it with :func:`parse_restriction`.

    ``kind`` is ``"none"`` (every trainable parameter), ``"forget_mask"`` (the mask set's forget groups,
    OracleGrad), ``"groups"`` (union of ``groups``), or ``"regex"`` (whole parameters whose name
    ``pattern`` matches with ``re.search``). ``str(restriction)`` gives the canonical spec string.
    """

    kind: _Kind
    groups: tuple[int, ...] = ()
    pattern: str = ""

    def __str__(self) -> str:
        if self.kind == "groups":
            return "groups:" + ",".join(str(g) for g in self.groups)
        if self.kind == "regex":
            return "regex:" + self.pattern
        return self.kind

    @property
    def needs_masks(self) -> bool:
        return self.kind in ("forget_mask", "groups")

    def resolve(self, model: torch.nn.Module, masks: MaskSet | None = None) -> Resolved:
        """Map each parameter that stays trainable to a bool mask of its shape (None = the whole parameter).

        Only parameters with ``requires_grad=True`` are candidates; a parameter missing from the result
        is to be frozen (:func:`apply_restriction` does that; this method changes nothing). For mask
        restrictions, parameters absent from ``masks`` or with no scalar in the selected groups are
        frozen, masks that select every scalar become None, and flat ``mask.pt`` masks are reshaped
        with :meth:`MaskSet.reshape_to`. Masks live on their parameter's device.

        Raises :class:`RestrictionError` (a ValueError) naming the tensor when masks are needed but
        missing, a mask names a parameter the model lacks, a mask's shape does not fit its parameter,
        a group is outside the mask set, or nothing would stay trainable.
        """
        params = dict(model.named_parameters())
        candidates = {n: p for n, p in params.items() if p.requires_grad}
        if not candidates:
            raise RestrictionError(f"restriction {str(self)!r}: the model has no trainable parameters")
        if self.kind == "none":
            return {n: None for n in candidates}
        if self.kind == "regex":
            regex = re.compile(self.pattern)
            out: Resolved = {n: None for n in candidates if regex.search(n)}
            if not out:
                raise RestrictionError(
                    f"restriction {str(self)!r} leaves nothing trainable: no trainable parameter name matches "
                    f"{self.pattern!r} (e.g. {_examples(candidates)})"
                )
            return out
        return self._resolve_masks(model, params, candidates, masks)

    def _resolve_masks(
        self,
        model: torch.nn.Module,
        params: dict[str, torch.nn.Parameter],
        candidates: dict[str, torch.nn.Parameter],
        masks: MaskSet | None,
    ) -> Resolved:
        if masks is None:
            raise RestrictionError(
                f"restriction {str(self)!r} needs a mask set (load_masks / build_masks), but masks=None was given"
            )
        if self.kind == "forget_mask":
            groups = tuple(masks.forget_groups or ())
            if not groups:
                raise RestrictionError(f"restriction 'forget_mask': the mask set has no forget groups ({masks!r})")
        else:
            groups = self.groups
            bad = [g for g in groups if g >= masks.num_groups]
            if bad:
                raise RestrictionError(
                    f"restriction {str(self)!r}: groups {bad} are not in the mask set's [0, {masks.num_groups})"
                )

        # Every name the model answers to, tied aliases included (named_parameters drops duplicates).
        canonical = {id(p): n for n, p in params.items()}
        alias_of = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
        for name in masks.packed:
            if name not in alias_of:
                raise RestrictionError(
                    f"mask for {name!r} names a parameter the model lacks (model parameters e.g. {_examples(params)})"
                )
        shapes = {n: tuple(params[c].shape) for n, c in alias_of.items()}

        # Flat mask.pt vectors -> parameter shapes. Only 1-D masks are reshaped: a 2-D mask of the
        # wrong shape (e.g. transposed) must fail, not be silently reinterpreted.
        flat = {n: p for n, p in masks.packed.items() if p.dim() == 1 and tuple(p.shape) != shapes[n]}
        packed = dict(masks.packed)
        if flat:
            try:
                packed.update(dataclasses.replace(masks, packed=flat).reshape_to(shapes).packed)
            except ValueError as exc:
                raise RestrictionError(str(exc)) from exc
        shaped = dataclasses.replace(masks, packed=packed)
        try:
            shaped.check_against({n: shapes[n] for n in packed}, "the model")
        except ValueError as exc:
            raise RestrictionError(str(exc)) from exc

        selected: dict[str, torch.Tensor] = {}
        for name in packed:
            target = alias_of[name]
            mask = shaped.union(name, groups)
            previous = selected.get(target)
            if previous is not None and not torch.equal(previous, mask):
                raise RestrictionError(
                    f"masks for tied names of parameter {target!r} (including {name!r}) select different scalars"
                )
            selected[target] = mask

        out: Resolved = {}
        for name, param in candidates.items():
            mask = selected.get(name)
            if mask is None or not bool(mask.any()):
                continue  # outside every selected group: frozen
            out[name] = None if bool(mask.all()) else mask.to(device=param.device, dtype=torch.bool)
        if not out:
            raise RestrictionError(
                f"restriction {str(self)!r} leaves nothing trainable: no trainable parameter has a scalar in "
                f"groups {groups} ({len(masks.packed)} mask tensors, {len(candidates)} trainable parameters)"
            )
        return out


def parse_restriction(spec: str) -> Restriction:
    """Parse ``forget_mask``, ``groups:0,2``, ``regex:<pattern>`` or ``none``; ValueError naming ``spec`` otherwise."""
    if not isinstance(spec, str):
        raise RestrictionError(f"restriction spec must be a string, got {spec!r}; {_SPEC_HELP}")
    text = spec.strip()
    if text in ("none", "forget_mask"):
        return Restriction(text)  # type: ignore[arg-type]
    if text.startswith("groups:"):
        items = [t.strip() for t in text[len("groups:") :].split(",")]
        groups: list[int] = []
        for item in items:
            if not re.fullmatch(r"\d+", item) or int(item) >= MAX_GROUPS:
                raise RestrictionError(
                    f"bad restriction spec {spec!r}: group {item!r} is not an integer in [0, {MAX_GROUPS}); "
                    f"expected e.g. 'groups:0,2'"
                )
            if int(item) not in groups:
                groups.append(int(item))
        return Restriction("groups", groups=tuple(groups))
    if text.startswith("regex:"):
        pattern = spec.lstrip()[len("regex:") :]  # keep the pattern verbatim
        if not pattern:
            raise RestrictionError(f"bad restriction spec {spec!r}: empty regex (it would match every parameter)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RestrictionError(f"bad restriction spec {spec!r}: invalid regex: {exc}") from None
        return Restriction("regex", pattern=pattern)
    raise RestrictionError(f"bad restriction spec {spec!r}; {_SPEC_HELP}")


# --------------------------------------------------------------------------------------------------
# Applying


class _MaskGrad:
    """Tensor hook: zero the gradient outside ``keep`` (same device as the gradient, dtype preserved)."""

    def __init__(self, keep: torch.Tensor) -> None:
        self.keep = keep  # shared with ``resolved``: one bool per scalar, no second copy

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        if self.keep.device != grad.device:  # the model was moved after apply_restriction
            self.keep = self.keep.to(grad.device)
        return torch.where(self.keep, grad, 0)


@dataclass
class RestrictionHandle:
    """What :func:`apply_restriction` changed. ``remove()`` removes the hooks and restores ``requires_grad``."""

    hooks: list[Any] = field(default_factory=list)
    frozen: list[torch.nn.Parameter] = field(default_factory=list)
    frozen_names: list[str] = field(default_factory=list)
    masked_names: list[str] = field(default_factory=list)
    removed: bool = False

    def remove(self) -> None:
        if self.removed:
            return
        for hook in self.hooks:
            hook.remove()
        for param in self.frozen:
            param.requires_grad_(True)
        self.hooks, self.frozen, self.removed = [], [], True

    def __enter__(self) -> RestrictionHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _check_resolved(model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]) -> dict[str, Any]:
    params = dict(model.named_parameters())
    for name, mask in resolved.items():
        if name not in params:
            raise RestrictionError(f"restricted parameter {name!r} is not a parameter of the model")
        if mask is None:
            continue
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise RestrictionError(f"restriction mask for {name!r} must be a bool tensor, got {mask!r:.80}")
        if tuple(mask.shape) != tuple(params[name].shape):
            raise RestrictionError(
                f"restriction mask for {name!r} has shape {tuple(mask.shape)} but the parameter has "
                f"{tuple(params[name].shape)}"
            )
    if not resolved:
        raise RestrictionError("the restriction leaves nothing trainable (resolved is empty)")
    return params


def apply_restriction(model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]) -> RestrictionHandle:
    """Freeze every parameter not in ``resolved`` and hook the gradient of every masked one.

    Parameters already frozen stay frozen (``remove()`` does not unfreeze them). Build the optimizer
    *after* this call with :func:`param_groups`: weight decay must be 0 for restricted parameters.
    """
    params = _check_resolved(model, resolved)
    handle = RestrictionHandle()
    try:
        for name, param in params.items():
            if name not in resolved:
                if param.requires_grad:
                    param.requires_grad_(False)
                    handle.frozen.append(param)
                    handle.frozen_names.append(name)
                continue
            mask = resolved[name]
            if mask is not None:
                keep = mask.to(device=param.device, dtype=torch.bool)
                handle.hooks.append(param.register_hook(_MaskGrad(keep)))
                handle.masked_names.append(name)
    except BaseException:
        handle.remove()
        raise
    return handle


def param_groups(
    model: torch.nn.Module,
    resolved: Mapping[str, torch.Tensor | None],
    weight_decay: float,
    *,
    decay_parameter_names: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Optimizer param groups: restricted (masked) parameters get ``weight_decay=0``, the rest ``weight_decay``.

    Only parameters in ``resolved`` appear. If ``decay_parameter_names`` is given (e.g. HF
    ``trainer.get_decay_parameter_names(model)``, which leaves out biases and norms), unrestricted
    parameters outside it get 0 as well. Empty groups are left out. Every group sets
    ``weight_decay`` explicitly, so the optimizer's default (0.01 for ``torch.optim.AdamW``) never applies.
    """
    params = _check_resolved(model, resolved)
    restricted, decay, no_decay = [], [], []
    for name, param in params.items():
        if name not in resolved:
            continue
        if resolved[name] is not None:
            restricted.append(param)
        elif decay_parameter_names is None or name in decay_parameter_names:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [
        {"params": restricted, "weight_decay": 0.0},
        {"params": decay, "weight_decay": float(weight_decay)},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def exempt_from_decay(
    groups: Iterable[Mapping[str, Any]], model: torch.nn.Module, decay_parameter_names: Collection[str]
) -> list[dict[str, Any]]:
    """``groups`` with every parameter outside ``decay_parameter_names`` moved to a ``weight_decay=0`` group.

    HF Trainer decays only ``trainer.get_decay_parameter_names(model)`` (every weight but biases and norms): decay
    pulls a LayerNorm/RMSNorm gain towards 0, not towards its natural 1, and a bias has no scale to regularise.
    Groups whose ``weight_decay`` is already 0 are kept as they are; the exempt parameters of a decayed group get a
    group of their own with the same other settings. Parameters not found in ``model`` keep their group."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: list[dict[str, Any]] = []
    for group in groups:
        group = dict(group)
        if not group.get("weight_decay"):
            out.append(group)
            continue
        params = list(group["params"])
        exempt = [p for p in params if id(p) in names and names[id(p)] not in decay_parameter_names]
        left_out = {id(p) for p in exempt}
        kept = [p for p in params if id(p) not in left_out]
        if kept:
            out.append({**group, "params": kept})
        if exempt:
            out.append({**group, "params": exempt, "weight_decay": 0.0})
    return out


def check_optimizer(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]
) -> None:
    """Raise RestrictionError naming the tensor if the optimizer could move an out-of-mask scalar.

    That is the case when a restricted parameter sits in a group with nonzero ``weight_decay`` or has
    optimizer state (e.g. Adam's ``exp_avg`` / ``exp_avg_sq``) that is nonzero outside its mask, and
    when a parameter that should be frozen is in the optimizer with ``requires_grad=True``.
    """
    params = _check_resolved(model, resolved)
    names = {id(p): n for n, p in params.items()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            name = names.get(id(param))
            if name is None:
                continue
            if name not in resolved:
                if param.requires_grad:
                    raise RestrictionError(f"parameter {name!r} is outside the restriction but still requires grad")
                continue
            mask = resolved[name]
            if mask is None:
                continue
            if group.get("weight_decay", 0.0):
                raise RestrictionError(
                    f"restricted parameter {name!r} is in an optimizer group with weight_decay="
                    f"{group['weight_decay']}; weight decay would move its out-of-mask scalars (use param_groups)"
                )
            for key, value in optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.shape == param.shape:
                    if bool((value.detach()[~mask.to(value.device)] != 0).any()):
                        raise RestrictionError(
                            f"optimizer state {key!r} of restricted parameter {name!r} is nonzero outside its "
                            f"mask; those scalars would move (start from a fresh optimizer)"
                        )


# --------------------------------------------------------------------------------------------------
# Sharded parameters (FSDP2)

#: Name segments that wrappers insert into parameter names (FSDP1, activation checkpointing, torch.compile).
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def _clean_name(name: str) -> str:
    """The parameter's name in the unwrapped model (wrapper segments removed)."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def shard_masks(
    model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """``(parameter, drop)`` for every masked parameter of a (possibly FSDP2-sharded) model.

    ``drop`` is True where the gradient must be zeroed, shaped like the rank's local shard: for a
    DTensor parameter, the mask is cut with the parameter's own mesh and placements (no communication);
    a plain parameter gets the whole mask. Call it after the model is sharded (the sharded parameters
    are new objects). Raises :class:`RestrictionError` naming the tensor if a masked parameter is
    missing or its mask does not fit.
    """
    dtensor = _dtensor_type()
    out: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    found: set[str] = set()
    for raw, param in model.named_parameters():
        name = _clean_name(raw)
        mask = resolved.get(name)
        if mask is None:
            continue
        found.add(name)
        if tuple(mask.shape) != tuple(param.shape):
            raise RestrictionError(
                f"restriction mask for {name!r} has shape {tuple(mask.shape)} but the (sharded) parameter has "
                f"{tuple(param.shape)}"
            )
        if dtensor is not None and isinstance(param, dtensor):
            from torch.distributed.tensor import distribute_tensor

            local = param.to_local()
            keep = distribute_tensor(
                mask.to(device=local.device, dtype=torch.bool), param.device_mesh, param.placements, src_data_rank=None
            ).to_local()
            if tuple(keep.shape) != tuple(local.shape):
                raise RestrictionError(
                    f"cannot cut the mask of {name!r} to this rank's shard: placements {param.placements} give "
                    f"{tuple(keep.shape)}, the local shard is {tuple(local.shape)}"
                )
        else:
            keep = mask.to(device=param.device, dtype=torch.bool)
        out.append((param, ~keep))
    missing = [n for n, m in resolved.items() if m is not None and n not in found]
    if missing:
        raise RestrictionError(f"masked parameters {missing[:5]} are not in the (sharded) model")
    return out


def mask_gradients(masks: Iterable[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    """Zero every gradient entry that :func:`shard_masks` marks (local shards of DTensor gradients, in place).

    ``masked_fill_`` also turns a non-finite out-of-mask value into 0, as the hooks do.
    """
    dtensor = _dtensor_type()
    with torch.no_grad():
        for param, drop in masks:
            grad = param.grad
            if grad is None:
                continue
            local = grad.to_local() if dtensor is not None and isinstance(grad, dtensor) else grad
            if local.device != drop.device:
                drop = drop.to(local.device)
            local.masked_fill_(drop, 0)


# --------------------------------------------------------------------------------------------------
# Checking


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def intersect(resolved: Mapping[str, torch.Tensor | None], located: Mapping[str, torch.Tensor | None]) -> Resolved:
    """Scalars trainable under both restrictions (e.g. the user's ``restrict=`` and a method's own localisation).

    A parameter stays only if both name it; masks are AND-ed (None = the whole parameter). A result that leaves
    nothing trainable raises :class:`RestrictionError`.
    """
    out: Resolved = {}
    for name, mask in resolved.items():
        if name not in located:
            continue
        other = located[name]
        if mask is None or other is None:
            out[name] = other if mask is None else mask
        else:
            if tuple(mask.shape) != tuple(other.shape):
                raise RestrictionError(
                    f"localisation mask for {name!r} has shape {tuple(other.shape)}, expected {tuple(mask.shape)}"
                )
            out[name] = mask & other.to(mask.device)
    out = {n: m for n, m in out.items() if m is None or bool(m.any())}
    if not out:
        raise RestrictionError("the method's localisation and the restriction leave nothing trainable")
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """View a tensor as integers of the same width, so equality is bitwise (NaN == NaN, -0.0 != 0.0)."""
    if t.dtype.is_floating_point or t.dtype.is_complex:
        size = t.element_size()
        if t.dtype.is_complex:
            t, size = torch.view_as_real(t), size // 2
        return t.contiguous().view(_INT_OF_SIZE[size])
    return t


def verify_unchanged(
    before_state: Mapping[str, torch.Tensor], model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]
) -> list[str]:
    """Names of parameters with any out-of-mask scalar not bit-identical to ``before_state``, in model order.

    Parameters missing from ``resolved`` must be entirely unchanged; masked ones outside their mask;
    whole-parameter (None) entries are not checked. ``before_state`` maps parameter names to tensors
    (e.g. ``{n: p.detach().clone() for n, p in model.named_parameters()}`` or a state dict). A missing
    name or a different shape/dtype raises RestrictionError naming the tensor.

    A sharded (FSDP2 DTensor) parameter is gathered with ``full_tensor()``, a collective: under FSDP,
    call this on every rank. Wrapper segments in names (``_checkpoint_wrapped_module.`` etc.) are ignored.
    """
    dtensor = _dtensor_type()
    changed: list[str] = []
    for raw, param in model.named_parameters():
        name = _clean_name(raw)
        if name in resolved and resolved[name] is None:
            continue
        if name not in before_state:
            raise RestrictionError(f"before_state has no tensor for parameter {name!r}")
        before = before_state[name]
        after = param.detach()
        if dtensor is not None and isinstance(after, dtensor):
            after = after.full_tensor()
        if tuple(before.shape) != tuple(after.shape) or before.dtype != after.dtype:
            raise RestrictionError(
                f"before_state[{name!r}] is {before.dtype}{tuple(before.shape)} but the parameter is "
                f"{after.dtype}{tuple(after.shape)}"
            )
        a, b = _bits(after), _bits(before.detach().to(after.device))
        mask = resolved.get(name)
        if mask is not None:
            outside = ~mask.to(after.device)
            a, b = a[outside], b[outside]
        if not torch.equal(a, b):
            changed.append(name)
    return changed


def restriction_stats(model: torch.nn.Module, resolved: Mapping[str, torch.Tensor | None]) -> dict[str, Any]:
    """JSON-ready counts for a run manifest: trainable / masked / frozen parameters and scalars."""
    params = _check_resolved(model, resolved)
    total = sum(p.numel() for p in params.values())
    trainable = sum(
        params[n].numel() if m is None else int(m.sum()) for n, m in resolved.items()
    )  # scalars that may move
    return {
        "num_parameters": len(params),
        "num_trainable_parameters": len(resolved),
        "num_masked_parameters": sum(m is not None for m in resolved.values()),
        "total_scalars": total,
        "trainable_scalars": trainable,
        "trainable_fraction": trainable / total if total else 0.0,
    }


def _examples(names: Iterable[str], k: int = 4) -> str:
    names = list(names)
    return ", ".join(repr(n) for n in names[:k]) + (", ..." if len(names) > k else "") if names else "<none>"
