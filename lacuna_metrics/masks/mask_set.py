"""The in-memory mask set: which group owns each scalar of an eligible weight, and the group/bit arithmetic.

A mask set assigns each scalar of an *eligible* weight tensor to at most one of ``num_groups`` groups. Group ``g``
owns the scalars whose packed int32 value has bit ``g`` set. During masked pretraining the data of the people in
group ``g`` may update only those scalars, so we know where each person's knowledge was written. That ground truth
is what the localization metrics score. Tensors absent from a :class:`MaskSet` are frozen for all groups.

This module is the one home of the bit semantics; construction lives in :mod:`lacuna_metrics.masks.build`, the
files in :mod:`lacuna_metrics.masks.files`, and :mod:`lacuna_metrics.masks` re-exports all three.

Definitions: ``docs/definitions.md``, sections ``#checkpoints-and-mask-files`` (``mask.pt``), ``#oraclegrad``
(forget mask), ``#localization-precision`` (parameter universe).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from lacuna_metrics.weights.anatomy import classify_name, layer_of

__all__ = [
    "MAX_GROUPS",
    "MaskError",
    "MaskSet",
    "Shapes",
    "component",
    "group_bits",
    "layer_index",
    "named_shapes_of",
    "trivial_mask_stats",
]


class MaskError(ValueError):
    """An invalid mask configuration, mask set, or mask file. The message names the tensor or file."""


#: One int32 per scalar, so at most 32 groups.
MAX_GROUPS: int = 32


_FINGERPRINT_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

Shapes = Mapping[str, "tuple[int, ...] | torch.Size"]


# --------------------------------------------------------------------------------------------------
# Names


def layer_index(name: str) -> int | None:
    """Transformer block index N of ``...layers.N....`` / ``...h.N....`` / ``...blocks.N....``, or None (embeddings,
    final norm, lm_head).

    Used to keep the last blocks (instruction-tuning LoRA) out of the masks and to group scores per layer.
    """
    return layer_of(name)


def component(name: str) -> Literal["attention", "mlp", "expert", "router"] | None:
    """The component of a block projection (weight or bias) by the name rules of :mod:`lacuna_metrics.weights.anatomy`:
    ``attention``, ``mlp``, ``expert`` (MoE experts) or ``router``. None for anything else.

    Norms (including OLMo2's ``self_attn.q_norm``), embeddings and ``lm_head`` get None. The ``layernorm``
    score (docs/definitions.md#localization-precision) normalises per (layer, component).
    """
    weight = classify_name(name)
    return None if weight is None else weight.component  # type: ignore[return-value]


def named_shapes_of(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Map each parameter name to its shape, in ``named_parameters`` order. This is the input of the builders.

    Tied weights appear once, as in ``named_parameters``, so the parameter count is right.
    """
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _as_shapes(named_shapes: Shapes) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in named_shapes.items():
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise MaskError(f"parameter {name!r} has an invalid shape {dims}")
        out[name] = dims
    return out


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _shape_str(shape: Iterable[int]) -> str:
    return str(tuple(int(d) for d in shape))


# --------------------------------------------------------------------------------------------------
# Groups and bits


def _check_num_groups(num_groups: int) -> None:
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= MAX_GROUPS:
        raise MaskError(
            f"num_groups must be an integer in [1, {MAX_GROUPS}] (one int32 bit per group), got {num_groups!r}"
        )


def _signed32(value: int) -> int:
    """Reinterpret an unsigned 32-bit pattern as the signed int32 value that torch stores."""
    return value - (1 << 32) if value >= (1 << 31) else value


def group_bits(groups: Iterable[int]) -> int:
    """Return the int32 bit pattern ``sum(1 << g)`` as a signed Python int, ready for ``packed & bits``.

    Group 31 maps to the sign bit, so the value can be negative. OracleGrad's forget mask is
    ``(packed & group_bits(forget_groups)) != 0`` (docs/definitions.md#oraclegrad).
    """
    value = 0
    for g in groups:
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < MAX_GROUPS:
            raise MaskError(f"group index must be an integer in [0, {MAX_GROUPS}), got {g!r}")
        value |= 1 << g
    return _signed32(value)


def _bit_table(num_groups: int) -> torch.Tensor:
    """Packed value for each band: ``1 << b`` for b < num_groups, then 0 for "no group"."""
    return torch.tensor([_signed32(1 << b) for b in range(num_groups)] + [0], dtype=torch.int32)


def _default_groups(num_groups: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Even groups forget, odd groups retain. For six groups this is LACUNA's (0, 2, 4) / (1, 3, 5)."""
    return tuple(range(0, num_groups, 2)), tuple(range(1, num_groups, 2))


def _checked_groups(
    num_groups: int, forget_groups: Iterable[int] | None, retain_groups: Iterable[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(forget, retain) groups, defaults filled in; every index in [0, num_groups), the two sides disjoint."""
    _check_num_groups(num_groups)
    default_forget, default_retain = _default_groups(num_groups)
    forget = default_forget if forget_groups is None else tuple(forget_groups)
    retain = default_retain if retain_groups is None else tuple(retain_groups)
    for label, groups in (("forget_groups", forget), ("retain_groups", retain)):
        for g in groups:
            if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < num_groups:
                raise MaskError(f"{label} contains {g!r}, not a group index in [0, {num_groups})")
    if set(forget) & set(retain):
        raise MaskError(f"forget_groups {forget} and retain_groups {retain} overlap")
    return forget, retain


def _check_fingerprint(value: object) -> str:
    if not isinstance(value, str) or not _FINGERPRINT_RE.match(value):
        raise MaskError(f"model fingerprint {value!r} is not 'sha256:' and 64 hex digits (Checkpoint.fingerprint())")
    return value


def _stray_bit(packed: torch.Tensor, num_groups: int) -> int | None:
    """The highest bit >= ``num_groups`` set in ``packed`` (a uint8 or int32 bit field), or None: one min/max pass."""
    width = 8 if packed.dtype == torch.uint8 else 32
    if num_groups >= width or packed.numel() == 0:
        return None
    low, high = (int(v) for v in torch.aminmax(packed.reshape(-1)))
    if low < 0:
        return 31  # the sign bit of an int32 field
    return high.bit_length() - 1 if high >> num_groups else None


# --------------------------------------------------------------------------------------------------
# MaskSet


@dataclass(eq=False, repr=False)
class MaskSet:
    """Packed group masks for the eligible tensors of one model.

    ``packed[name]`` is an int32 tensor. Bit ``g`` is set when the scalar belongs to group ``g``. Built
    and safetensors masks have the parameter's shape. Masks read from ``mask.pt`` stay flat (``(numel,)``)
    until :meth:`reshape_to`. Names absent from ``packed`` are frozen for all groups.

    If ``forget_groups`` / ``retain_groups`` are not given, they become the even / odd groups, which is
    (0, 2, 4) / (1, 3, 5) for LACUNA's six groups. ``budget`` and ``seed`` are None when unknown
    (``mask.pt``). ``extra`` holds free-form string metadata that is saved with the file.
    ``model_fingerprint`` is the content fingerprint of the model the masks were built for, when known
    (our files since it was added; never a ``mask.pt``): ``lacuna score`` refuses masks of another model.
    """

    packed: dict[str, torch.Tensor]
    num_groups: int = 6
    budget: float | None = None
    seed: int | None = None
    forget_groups: tuple[int, ...] | None = None
    retain_groups: tuple[int, ...] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    model_fingerprint: str | None = None

    def __post_init__(self) -> None:
        self.forget_groups, self.retain_groups = _checked_groups(
            self.num_groups, self.forget_groups, self.retain_groups
        )
        if self.model_fingerprint is not None:
            _check_fingerprint(self.model_fingerprint)
        for name, tensor in self.packed.items():
            if not isinstance(tensor, torch.Tensor):
                raise MaskError(f"mask for {name!r} is a {type(tensor).__name__}, expected an int32 torch.Tensor")
            if tensor.dtype != torch.int32:
                raise MaskError(f"mask for {name!r} has dtype {tensor.dtype}, expected torch.int32")
        for key, value in self.extra.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise MaskError(f"extra metadata must map str to str, got {key!r}: {value!r}")

    def __repr__(self) -> str:
        return (
            f"MaskSet({len(self.packed)} tensors, num_groups={self.num_groups}, budget={self.budget}, "
            f"seed={self.seed}, forget_groups={self.forget_groups}, retain_groups={self.retain_groups})"
        )

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self.packed[name]
        except KeyError:
            raise MaskError(
                f"no mask for {name!r} (tensors absent from a mask set are frozen for all groups)"
            ) from None

    def _check_group(self, g: int) -> None:
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < self.num_groups:
            raise MaskError(f"group {g!r} is not in [0, {self.num_groups})")

    def group(self, name: str, g: int) -> torch.Tensor:
        """Return a bool mask of the scalars of ``name`` that belong to group ``g``."""
        self._check_group(g)
        return ((self._get(name) >> g) & 1).bool()

    def union(self, name: str, groups: Iterable[int]) -> torch.Tensor:
        """Return a bool mask of the scalars in any of ``groups``: ``(packed & sum(1 << g)) != 0``."""
        groups = tuple(groups)
        for g in groups:
            self._check_group(g)
        return (self._get(name) & group_bits(groups)) != 0

    def forget_mask(self, name: str) -> torch.Tensor:
        """Return the scalars of the forget groups: OracleGrad's gradient mask and the AUC ``forget`` label."""
        assert self.forget_groups is not None
        return self.union(name, self.forget_groups)

    def retain_mask(self, name: str) -> torch.Tensor:
        """Return the scalars of the retain groups."""
        assert self.retain_groups is not None
        return self.union(name, self.retain_groups)

    def unpack(self, name: str) -> torch.Tensor:
        """Return all groups as bool ``[num_groups, *shape]``, the inverse of packing."""
        packed = self._get(name)
        return torch.stack([((packed >> g) & 1).bool() for g in range(self.num_groups)])

    def counts(self) -> dict[str, list[int]]:
        """Count the scalars in each group for each tensor, to check budgets and for manifests."""
        return {name: [int(((p >> g) & 1).sum()) for g in range(self.num_groups)] for name, p in self.packed.items()}

    def total_counts(self) -> list[int]:
        """Count the scalars in each group over all tensors."""
        totals = [0] * self.num_groups
        for per_tensor in self.counts().values():
            for g, c in enumerate(per_tensor):
                totals[g] += c
        return totals

    def nonzero_names(self) -> list[str]:
        """List the tensors with at least one bit set, in order.

        A released ``mask.pt`` lists every parameter and gives skipped ones all-zero vectors. Those
        vectors are kept on load, so the file round-trips unchanged. This method finds the tensors that
        were actually masked. For masks built here, every tensor is eligible.
        """
        return [name for name, p in self.packed.items() if bool((p != 0).any())]

    def check_against(self, named_shapes: Shapes, source: str) -> None:
        """Raise MaskError if a mask has no parameter in ``source`` or its shape differs.

        Call this before training or scoring, so a mask built for another model fails loudly and does
        not silently broadcast or get skipped.
        """
        shapes = _as_shapes(named_shapes)
        for name, packed in self.packed.items():
            if name not in shapes:
                raise MaskError(f"mask for {name!r} has no matching parameter in {source}")
            if tuple(packed.shape) != shapes[name]:
                hint = ""
                if packed.dim() == 1 and packed.numel() == _numel(shapes[name]) and len(shapes[name]) != 1:
                    hint = " (flat mask.pt tensor: call reshape_to first)"
                raise MaskError(
                    f"mask for {name!r} has shape {_shape_str(packed.shape)} but parameter has shape "
                    f"{_shape_str(shapes[name])} in {source}{hint}"
                )

    def reshape_to(self, named_shapes: Shapes, source: str = "the model") -> MaskSet:
        """Return a new MaskSet with each (flat ``mask.pt``) mask reshaped to its parameter's shape.

        The flattening is row-major (docs/definitions.md#checkpoints-and-mask-files), so ``reshape`` is exact. Raise
        MaskError naming the tensor on a missing parameter or a numel mismatch.
        """
        shapes = _as_shapes(named_shapes)
        out: dict[str, torch.Tensor] = {}
        for name, packed in self.packed.items():
            if name not in shapes:
                raise MaskError(f"mask for {name!r} has no matching parameter in {source}")
            target = shapes[name]
            if packed.numel() != _numel(target):
                raise MaskError(
                    f"mask for {name!r} has {packed.numel()} scalars but parameter has shape "
                    f"{_shape_str(target)} ({_numel(target)} scalars) in {source}"
                )
            if packed.dim() > 1 and tuple(packed.shape) != tuple(target):
                raise MaskError(  # a transposed mask would reshape silently into scrambled ground truth
                    f"mask for {name!r} has shape {_shape_str(packed.shape)} but parameter has shape "
                    f"{_shape_str(target)} in {source}; only flat masks are reshaped"
                )
            out[name] = packed.reshape(target)
        return dataclasses.replace(self, packed=out, extra=dict(self.extra))


# --------------------------------------------------------------------------------------------------
# Manifest statistics


def trivial_mask_stats(maskset: MaskSet, total_params: int | None = None) -> dict[str, Any]:
    """Summarise group sizes and disjointness for manifests, as JSON-ready numbers.

    Fractions are over the *eligible* scalars, meaning the tensors with at least one bit set
    (:meth:`MaskSet.nonzero_names`), so a ``mask.pt`` with zero vectors for skipped tensors gives the
    same numbers as our files. ``overlap_scalars`` counts scalars in two or more groups and must be 0.
    ``stray_bit_scalars`` counts bits >= num_groups, which is nonzero for single-group release masks that
    replicate bit 0 to all 32 bits. If ``total_params`` (P_tot) is given, the fractions of the whole
    model, which the budget targets, are added.
    """
    n = maskset.num_groups
    in_groups = group_bits(range(n))
    counts = [0] * n
    overlap = stray = scalars = eligible = nonzero_tensors = 0
    for packed in maskset.packed.values():
        scalars += packed.numel()
        if not bool((packed != 0).any()):
            continue
        nonzero_tensors += 1
        eligible += packed.numel()
        member = packed & in_groups
        overlap += int(((member & (member - 1)) != 0).sum())  # more than one bit set
        stray += int(((packed & ~in_groups) != 0).sum())
        for g in range(n):
            counts[g] += int(((packed >> g) & 1).sum())
    stats: dict[str, Any] = {
        "num_groups": n,
        "budget": maskset.budget,
        "seed": maskset.seed,
        "forget_groups": list(maskset.forget_groups or ()),
        "retain_groups": list(maskset.retain_groups or ()),
        "num_tensors": len(maskset.packed),
        "num_nonzero_tensors": nonzero_tensors,
        "scalars": scalars,
        "eligible_scalars": eligible,
        "group_counts": counts,
        "group_fraction_of_eligible": [c / eligible if eligible else 0.0 for c in counts],
        "assigned_fraction_of_eligible": sum(counts) / eligible if eligible else 0.0,
        "overlap_scalars": overlap,
        "stray_bit_scalars": stray,
        "disjoint": overlap == 0,
    }
    if total_params is not None:
        if total_params <= 0:
            raise MaskError(f"total_params must be positive, got {total_params}")
        stats["total_params"] = total_params
        stats["group_fraction_of_total"] = [c / total_params for c in counts]
    return stats
