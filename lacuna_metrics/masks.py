"""LACUNA parameter masks: build, bit-pack, save, and load them (ours and the released ``mask.pt``).

A mask set assigns each scalar of an *eligible* weight tensor to at most one of ``num_groups``
groups. Group ``g`` owns the scalars whose packed int32 value has bit ``g`` set. On disk our files store
the narrowest bit field that holds every group (uint8 up to 8 groups: LACUNA's 6 take a quarter of the
int32's bytes, which the scorer must read for every scalar); in memory a :class:`MaskSet` is always int32. During masked
pretraining the data of the people in group ``g`` may update only those scalars, so we know where
each person's knowledge was written. That ground truth is what the localization metrics score.

Tensors absent from a :class:`MaskSet` are frozen for all groups. A released ``mask.pt`` instead
lists every parameter and stores all-zero vectors for the frozen ones (see
:meth:`MaskSet.nonzero_names`).

Definitions: ``docs/definitions.md``, sections ``#checkpoints-and-mask-files`` (``mask.pt``), ``#lacuna-masks``
(construction), ``#oraclegrad`` (forget mask), ``#localization-precision`` (parameter universe).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors import SafetensorError, safe_open

from lacuna_metrics.anatomy import PROJECTION_WEIGHT_PATTERN, classify_name, layer_of
from lacuna_metrics.manifest import save_tensors

if TYPE_CHECKING:
    from lacuna_metrics.checkpoints import Scratch

__all__ = [
    "DEFAULT_ELIGIBLE_PATTERN",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LACUNA_RELEASE_PATTERN",
    "MAX_GROUPS",
    "MaskError",
    "MaskReader",
    "MaskSet",
    "build_masks",
    "component",
    "eligible_parameters",
    "group_bits",
    "layer_index",
    "load_masks",
    "named_shapes_of",
    "save_masks",
    "stamp_masks",
    "storage_dtype",
    "trivial_mask_stats",
]


class MaskError(ValueError):
    """An invalid mask configuration, mask set, or mask file. The message names the tensor or file."""


#: One int32 per scalar, so at most 32 groups.
MAX_GROUPS: int = 32

#: ``format`` / ``version`` metadata of our safetensors mask files. Version 2 stores uint8 bit fields when
#: ``num_groups <= 8`` (int32 otherwise); version 1 files (always int32) are still read.
FORMAT_NAME: str = "lacuna-bench-masks"
FORMAT_VERSION: str = "2"
_READABLE_VERSIONS = {"1": ("I32",), "2": ("U8", "I32")}
_SAFETENSORS_NAMES = {"U8": torch.uint8, "I32": torch.int32}

#: Attention and MLP weight matrices of transformer blocks, from the name rules of :mod:`lacuna_metrics.anatomy`
#: (docs/anatomy.md). This is the paper's "feed-forward and attention parameters only"
#: (docs/definitions.md#lacuna-masks, caveat). On Llama / OLMo2 / Qwen2, GPT-NeoX and GPT-2 it matches exactly the
#: q/k/v/o/gate/up/down (query_key_value, dense, dense_h_to_4h, dense_4h_to_h; c_attn, c_proj, c_fc) weights it always
#: has; it also covers fused projections (Phi-3), OPT, Falcon, BLOOM and per-expert MoE matrices. It never matches
#: norms, biases, embeddings, routers, fused 3-D expert parameters or ``lm_head``. Use it with ``re.search``; any name
#: prefix is allowed.
DEFAULT_ELIGIBLE_PATTERN: str = PROJECTION_WEIGHT_PATTERN

#: The filter of the released ``create_masks`` code: every name without ``norm`` or ``embed_tokens``.
#: It includes an untied ``lm_head`` and biases. With ``budget=1 - 0.95`` this pattern reproduces the
#: released masks bit for bit (see :func:`build_masks`).
LACUNA_RELEASE_PATTERN: str = r"^(?!.*(?:norm|embed_tokens))"

_REQUIRED_METADATA = ("format", "version", "num_groups", "budget", "seed", "forget_groups", "retain_groups")
_ORDER_KEY = "tensor_order"
#: Optional metadata: :meth:`lacuna_metrics.checkpoints.Checkpoint.fingerprint` of the model the masks describe.
MODEL_KEY = "model_fingerprint"
_RESERVED_METADATA = frozenset((*_REQUIRED_METADATA, _ORDER_KEY, MODEL_KEY))
_FINGERPRINT_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")

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
    """The component of a block projection (weight or bias) by the name rules of :mod:`lacuna_metrics.anatomy`:
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
# Construction (docs/definitions.md#lacuna-masks)


def eligible_parameters(
    named_shapes: Shapes,
    num_layers: int,
    skip_last: int = 2,
    pattern: str = DEFAULT_ELIGIBLE_PATTERN,
) -> list[str]:
    """List the tensors that receive group bits, in ``named_parameters`` order (this fixes the RNG stream).

    A name is eligible if ``pattern`` matches it (``re.search``) and it is not in the last ``skip_last``
    blocks. Those blocks are kept for instruction-tuning LoRA (docs/definitions.md#checkpoints-and-mask-files). A
    matching name without a layer index is eligible: only blocks are skipped, as in the released code. A layer index >=
    ``num_layers`` raises MaskError, because it means ``num_layers`` is wrong and the wrong blocks would be skipped.
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise MaskError(f"num_layers must be a positive integer, got {num_layers!r}")
    if isinstance(skip_last, bool) or not isinstance(skip_last, int) or skip_last < 0:
        raise MaskError(f"skip_last must be a non-negative integer, got {skip_last!r}")
    regex = re.compile(pattern)
    cutoff = num_layers - skip_last
    matched: list[str] = []
    eligible: list[str] = []
    for name in named_shapes:
        if not regex.search(name):
            continue
        matched.append(name)
        layer = layer_index(name)
        if layer is not None and layer >= num_layers:
            raise MaskError(
                f"parameter {name!r} is in layer {layer} but num_layers={num_layers}; pass the model's layer count"
            )
        if layer is None or layer < cutoff:
            eligible.append(name)
    if not matched:
        examples = ", ".join(list(named_shapes)[:5]) or "<none>"
        raise MaskError(f"model has no parameters matching the eligible pattern {pattern!r} (e.g. names: {examples})")
    if not eligible:
        raise MaskError(
            f"all {len(matched)} parameters matching the eligible pattern are in the skipped last "
            f"{skip_last} of {num_layers} layers"
        )
    return eligible


def build_masks(
    named_shapes: Shapes,
    num_layers: int,
    *,
    num_groups: int = 6,
    budget: float = 0.05,
    seed: int = 42,
    skip_last: int = 2,
    pattern: str = DEFAULT_ELIGIBLE_PATTERN,
    forget_groups: tuple[int, ...] | None = None,
    retain_groups: tuple[int, ...] | None = None,
) -> MaskSet:
    """Build LACUNA's disjoint random per-scalar groups (``create_masks``, docs/definitions.md#lacuna-masks).

    Each group gets about ``budget`` of the *whole* model's scalars (P_tot), but only eligible scalars
    (P_act) are drawn. Every eligible scalar gets an i.i.d. ``r ~ U[0, 1)`` from one CPU generator seeded
    with ``seed``. Draws follow the input order, tensor by tensor. The scalar goes to band
    ``b = floor(r / a)`` with ``a = budget * P_tot / P_act``, and to group ``b`` if ``b < num_groups``.
    The arithmetic matches the released code (float32 ``r / a``, then ``.long()``). So with
    ``pattern=LACUNA_RELEASE_PATTERN`` and ``budget=1 - 0.95`` (the release's float) the result is
    identical to its ``mask.pt``. Unlike the release, a single group keeps just bit 0 (no replication to
    all 32 bits).
    """
    _check_num_groups(num_groups)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
        raise MaskError(f"budget must be a fraction in (0, 1], got {budget!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise MaskError(f"seed must be an integer, got {seed!r}")
    shapes = _as_shapes(named_shapes)
    names = eligible_parameters(shapes, num_layers, skip_last, pattern)
    p_tot = sum(_numel(s) for s in shapes.values())
    p_act = sum(_numel(shapes[n]) for n in names)
    if p_act == 0:
        raise MaskError(f"the {len(names)} eligible parameters hold no scalars")
    available = p_act / p_tot
    required = num_groups * budget
    if required > available:
        raise MaskError(
            f"{num_groups} groups x budget {budget} require {required:.2%} of the model's {p_tot} scalars, "
            f"but the eligible tensors hold only {available:.2%} ({p_act} scalars); "
            f"lower num_groups or budget, or make more tensors eligible"
        )
    rate = budget * (p_tot / p_act)  # same evaluation order as the released code
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    bits = _bit_table(num_groups)
    packed: dict[str, torch.Tensor] = {}
    for name in names:
        shape = shapes[name]
        r = torch.rand(_numel(shape), generator=generator)
        band = (r / rate).long()  # r >= 0, so truncation is floor
        packed[name] = bits[band.clamp_(max=num_groups)].reshape(shape)
    extra = {
        "pattern": pattern,
        "num_layers": str(num_layers),
        "skip_last": str(skip_last),
        "total_params": str(p_tot),
        "eligible_params": str(p_act),
    }
    return MaskSet(
        packed=packed,
        num_groups=num_groups,
        budget=float(budget),
        seed=seed,
        forget_groups=forget_groups,
        retain_groups=retain_groups,
        extra=extra,
    )


# --------------------------------------------------------------------------------------------------
# Files


def storage_dtype(num_groups: int) -> torch.dtype:
    """The on-disk bit field of a mask file: uint8 when every group fits in 8 bits, else int32."""
    return torch.uint8 if num_groups <= 8 else torch.int32


def save_masks(maskset: MaskSet, path: str | os.PathLike[str], *, model_fingerprint: str | None = None) -> Path:
    """Write ``maskset`` atomically as a safetensors file with one bit-field tensor per mask and string metadata.

    The bit field is :func:`storage_dtype` (uint8 for up to 8 groups, the bits unchanged). ``model_fingerprint``
    (default: ``maskset.model_fingerprint``) is :meth:`lacuna_metrics.checkpoints.Checkpoint.fingerprint` of the
    model the masks describe; ``lacuna score`` then refuses them for another model. Masks built before that model
    exists (the testbed's injection) are stamped afterwards with :func:`stamp_masks`.

    The file is written to a temporary file in the target directory and then ``os.replace``-d, so readers
    never see a partial file. Unknown ``budget`` / ``seed`` are stored as empty strings.
    """
    path = Path(path)
    clash = sorted(_RESERVED_METADATA & set(maskset.extra))
    if clash:
        raise MaskError(f"extra metadata uses reserved keys {clash}")
    assert maskset.forget_groups is not None and maskset.retain_groups is not None
    metadata = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "num_groups": str(maskset.num_groups),
        "budget": "" if maskset.budget is None else repr(float(maskset.budget)),
        "seed": "" if maskset.seed is None else str(int(maskset.seed)),
        "forget_groups": ",".join(str(g) for g in maskset.forget_groups),
        "retain_groups": ",".join(str(g) for g in maskset.retain_groups),
        _ORDER_KEY: json.dumps(list(maskset.packed)),
        **maskset.extra,
    }
    fingerprint = model_fingerprint or maskset.model_fingerprint
    if fingerprint is not None:
        metadata[MODEL_KEY] = _check_fingerprint(fingerprint)
    dtype = storage_dtype(maskset.num_groups)
    return save_tensors(path, {name: t.to(dtype) for name, t in maskset.packed.items()}, metadata)


def stamp_masks(path: str | os.PathLike[str], model_fingerprint: str) -> Path:
    """Record ``model_fingerprint`` in an existing mask file of ours, atomically; the tensors are not touched.

    The testbed builds its masks before the injected model exists; once it does, this ties the file to it
    (``lacuna score`` compares it with ``--before``'s fingerprint). Only the safetensors header is rewritten;
    the tensor bytes are copied as they are, into a temp file in the same directory that then replaces ``path``
    (its file mode kept). Raises MaskError for a file that is not one of ours (a ``mask.pt`` cannot be stamped).
    """
    import shutil
    import stat
    import struct
    import tempfile

    path = Path(path)
    fingerprint = _check_fingerprint(model_fingerprint)
    if not path.is_file():
        raise FileNotFoundError(f"mask file not found: {path}")
    if _sniff(path) != "safetensors":
        raise MaskError(f"{path}: a PyTorch mask.pt cannot be stamped; convert it with load_masks + save_masks")
    with path.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = json.loads(fh.read(n)) if 0 < n <= 100 * 1024 * 1024 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        raise MaskError(f"{path}: not a {FORMAT_NAME} file (no such metadata); only our mask files can be stamped")
    header["__metadata__"] = {**metadata, MODEL_KEY: fingerprint}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # keep the data 8-byte aligned, as safetensors writes it
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out, path.open("rb") as src:
            out.write(struct.pack("<Q", len(blob)) + blob)
            src.seek(8 + n)
            shutil.copyfileobj(src, out, 8 << 20)
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_masks(
    path: str | os.PathLike[str],
    *,
    num_groups: int | None = None,
    forget_groups: tuple[int, ...] | None = None,
    retain_groups: tuple[int, ...] | None = None,
) -> MaskSet:
    """Read our safetensors mask file or a released LACUNA ``mask.pt``. The kind is detected from the bytes.

    safetensors: metadata is validated; ``num_groups``, if given, must agree with it. ``mask.pt``: a dict
    ``name -> flat int32 tensor`` read only via ``torch.load(weights_only=True)``. Its tensors stay flat
    (call :meth:`MaskSet.reshape_to`) and all-zero vectors are kept. ``num_groups`` defaults to 6 and
    budget/seed are None. Malformed files raise MaskError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mask file not found: {path}")
    if _sniff(path) == "torch":
        return _load_mask_pt(path, num_groups, forget_groups, retain_groups)
    return _load_safetensors(path, num_groups, forget_groups, retain_groups)


def _sniff(path: Path) -> Literal["torch", "safetensors"]:
    with path.open("rb") as fh:
        head = fh.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # u64 header length, then the JSON header
        return "safetensors"
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":  # torch zip archive / legacy pickle
        return "torch"
    return "torch" if path.suffix in _TORCH_SUFFIXES else "safetensors"


def _parse_groups(path: Path, key: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",")) if text else ()
    except ValueError:
        raise MaskError(f"{path}: metadata {key}={text!r} is not a comma-separated list of integers") from None


def _load_safetensors(
    path: Path,
    num_groups: int | None,
    forget_groups: tuple[int, ...] | None,
    retain_groups: tuple[int, ...] | None,
) -> MaskSet:
    packed: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            metadata = fh.metadata() or {}
            missing = [k for k in _REQUIRED_METADATA if k not in metadata]
            if missing:
                raise MaskError(
                    f"{path}: missing metadata keys {missing}; not a {FORMAT_NAME} file (use load_masks on our "
                    f"safetensors output or a LACUNA mask.pt)"
                )
            allowed = _READABLE_VERSIONS.get(metadata["version"], ("I32",))
            for name in fh.keys():
                dtype = fh.get_slice(name).get_dtype()
                if dtype not in allowed:
                    raise MaskError(
                        f"{path}: tensor {name!r} has dtype {dtype}, expected {' or '.join(allowed)} "
                        f"(mask file version {metadata['version']})"
                    )
                packed[name] = fh.get_tensor(name).to(torch.int32)
    except MaskError:
        raise
    except (SafetensorError, OSError, ValueError) as exc:
        raise MaskError(f"{path} is not a readable safetensors mask file: {exc}") from exc

    if metadata["format"] != FORMAT_NAME:
        raise MaskError(f"{path}: metadata format={metadata['format']!r}, expected {FORMAT_NAME!r}")
    if metadata["version"] not in _READABLE_VERSIONS:
        raise MaskError(
            f"{path}: unsupported mask file version {metadata['version']!r} (expected one of {sorted(_READABLE_VERSIONS)})"
        )
    try:
        file_groups = int(metadata["num_groups"])
        budget = float(metadata["budget"]) if metadata["budget"] else None
        seed = int(metadata["seed"]) if metadata["seed"] else None
    except ValueError as exc:
        raise MaskError(f"{path}: malformed metadata: {exc}") from exc
    if num_groups is not None and num_groups != file_groups:
        raise MaskError(f"{path} holds {file_groups} groups but num_groups={num_groups} was requested")
    if _ORDER_KEY in metadata:
        try:
            order = json.loads(metadata[_ORDER_KEY])
        except json.JSONDecodeError as exc:
            raise MaskError(f"{path}: malformed metadata {_ORDER_KEY}: {exc}") from exc
        if not isinstance(order, list) or sorted(order) != sorted(packed):
            raise MaskError(f"{path}: metadata {_ORDER_KEY} does not list exactly the stored tensors")
        packed = {name: packed[name] for name in order}
    extra = {k: v for k, v in metadata.items() if k not in _RESERVED_METADATA}
    try:
        return MaskSet(
            packed=packed,
            model_fingerprint=metadata.get(MODEL_KEY) or None,
            num_groups=file_groups,
            budget=budget,
            seed=seed,
            forget_groups=(
                _parse_groups(path, "forget_groups", metadata["forget_groups"])
                if forget_groups is None
                else forget_groups
            ),
            retain_groups=(
                _parse_groups(path, "retain_groups", metadata["retain_groups"])
                if retain_groups is None
                else retain_groups
            ),
            extra=extra,
        )
    except MaskError as exc:
        raise MaskError(f"{path}: {exc}") from exc


def _load_mask_pt(
    path: Path,
    num_groups: int | None,
    forget_groups: tuple[int, ...] | None,
    retain_groups: tuple[int, ...] | None,
) -> MaskSet:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike
        raise MaskError(f"{path} could not be read as a LACUNA mask.pt: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise MaskError(f"{path}: expected a dict name -> int32 tensor, got {type(obj).__name__}")
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in obj.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise MaskError(f"{path}: entry {name!r} is not a str -> tensor pair")
        if tensor.dtype != torch.int32:
            raise MaskError(f"{path}: tensor {name!r} has dtype {tensor.dtype}, expected torch.int32")
        packed[name] = tensor
    try:
        return MaskSet(
            packed=packed,
            num_groups=6 if num_groups is None else num_groups,
            budget=None,
            seed=None,
            forget_groups=forget_groups,
            retain_groups=retain_groups,
            extra={"source_format": "mask.pt", "source_file": path.name},
        )
    except MaskError as exc:
        raise MaskError(f"{path}: {exc}") from exc


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


# --------------------------------------------------------------------------------------------------
# Streaming access for scorers


class MaskReader:
    """Packed masks read tensor by tensor, so scoring a 7B pair never holds all masks at once.

    Our safetensors files are read in row blocks from disk. A released ``mask.pt`` (a pickle) is
    loaded whole with ``torch.load(weights_only=True)`` and its flat vectors are reshaped on read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        forget_groups: tuple[int, ...] | None = None,
        retain_groups: tuple[int, ...] | None = None,
    ) -> None:
        from lacuna_metrics.checkpoints import Checkpoint, CheckpointError

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"mask file not found: {self.path}")
        self._memory: MaskSet | None = None
        self._file: Checkpoint | None = None
        #: The model these masks were built for (our files only); None: they cannot be tied to a model.
        self.model_fingerprint: str | None = None
        if _sniff(self.path) == "torch":
            self._memory = load_masks(self.path, forget_groups=forget_groups, retain_groups=retain_groups)
            meta = self._memory
            self.num_groups, self.forget_groups, self.retain_groups = (
                meta.num_groups,
                meta.forget_groups,
                meta.retain_groups,
            )
            self.names = list(meta.packed)
        else:
            try:
                with safe_open(str(self.path), framework="pt", device="cpu") as fh:
                    metadata = fh.metadata() or {}
                self._file = Checkpoint(self.path, masks=True)
            except (SafetensorError, OSError, CheckpointError) as exc:
                raise MaskError(f"{self.path} is not a readable safetensors mask file: {exc}") from exc
            missing = [k for k in _REQUIRED_METADATA if k not in metadata]
            if missing or metadata.get("format") != FORMAT_NAME:
                raise MaskError(f"{self.path}: missing metadata {missing or ['format']}; not a {FORMAT_NAME} file")
            try:
                self.num_groups = int(metadata["num_groups"])
            except ValueError as exc:
                raise MaskError(f"{self.path}: malformed metadata num_groups: {exc}") from exc
            try:
                self.forget_groups, self.retain_groups = _checked_groups(
                    self.num_groups,
                    forget_groups or _parse_groups(self.path, "forget_groups", metadata["forget_groups"]),
                    retain_groups or _parse_groups(self.path, "retain_groups", metadata["retain_groups"]),
                )
                if metadata.get(MODEL_KEY):
                    self.model_fingerprint = _check_fingerprint(metadata[MODEL_KEY])
            except MaskError as exc:
                raise MaskError(f"{self.path}: {exc}") from None
            version = metadata["version"]
            if version not in _READABLE_VERSIONS:
                raise MaskError(f"{self.path}: unsupported mask file version {version!r}")
            allowed = {_SAFETENSORS_NAMES[d] for d in _READABLE_VERSIONS[version]}
            for name in self._file.names:
                if self._file.info(name).dtype not in allowed:
                    raise MaskError(
                        f"{self.path}: tensor {name!r} is {self._file.info(name).dtype}, expected "
                        f"{' or '.join(_READABLE_VERSIONS[version])} (mask file version {version})"
                    )
            self.names = list(self._file.names)
        self.forget_bits = group_bits(self.forget_groups or ())
        self.retain_bits = group_bits(self.retain_groups or ())

    def verify(self) -> str:
        """Read the whole file once: return its fingerprint (:func:`~lacuna_metrics.checkpoints.file_fingerprint`,
        the same digest) and refuse a scalar with a bit at or beyond ``num_groups`` set, naming tensor and bit.

        Such a bit belongs to no group: the scorer would silently count the scalar as outside every group.
        """
        import hashlib

        from lacuna_metrics.checkpoints import Scratch, _hash_range, file_fingerprint

        if self._memory is not None:
            for name, packed in self._memory.packed.items():
                self._refuse_stray_bits(name, packed)
            return file_fingerprint(self.path)
        assert self._file is not None
        ckpt, digest, scratch, done = self._file, hashlib.sha256(), Scratch(), 0
        infos = sorted((ckpt.info(n) for n in ckpt.names if not ckpt.is_alias(n)), key=lambda i: i.offset)
        for info in infos:  # header and gaps hashed as they are, tensors while their bits are checked
            if info.offset < done:
                raise MaskError(f"{self.path}: the data of tensor {info.name!r} overlaps another tensor's")
            _hash_range(self.path, done, info.offset - done, digest)
            for start, stop in ckpt.iter_blocks(info.name, 1 << 24):
                block = ckpt.read_raw(info.name, start, stop, scratch=scratch).reshape(-1)
                digest.update(block.view(torch.uint8).numpy().data)
                self._refuse_stray_bits(info.name, block)
            done = info.offset + torch.empty((), dtype=info.dtype).element_size() * info.numel
        _hash_range(self.path, done, self.path.stat().st_size - done, digest)
        return "sha256:" + digest.hexdigest()

    def check_model(self, names: Iterable[str], shape_of: Any, source: str) -> None:
        """Before any scalar is read: every masked attention/MLP tensor exists in the model ``source`` (tensor
        ``names``, ``shape_of(name)`` its shape) with the mask's shape, and at least one does."""
        have = set(names)
        masked = [n for n in self.names if component(n) is not None]
        missing = [n for n in masked if n not in have]
        if missing:
            raise MaskError(f"{self.path} masks {len(missing)} tensors missing from {source}: {missing[:8]}")
        if not masked:
            raise MaskError(f"{self.path}: no masked attention/MLP tensors in {source}")
        for n in masked:
            self.check_shape(n, tuple(shape_of(n)), source)

    def _refuse_stray_bits(self, name: str, packed: torch.Tensor) -> None:
        bit = _stray_bit(packed, self.num_groups)
        if bit is not None:
            raise MaskError(
                f"{self.path}: mask for {name!r} sets bit {bit}, but the file has num_groups={self.num_groups} "
                f"(bits 0-{self.num_groups - 1}); it was built for more groups, or the file is damaged"
            )

    def numel(self, name: str) -> int:
        if self._memory is not None:
            return int(self._memory.packed[name].numel())
        assert self._file is not None
        return self._file.info(name).numel

    def shape(self, name: str) -> tuple[int, ...]:
        if self._memory is not None:
            return tuple(self._memory.packed[name].shape)
        assert self._file is not None
        return self._file.shape(name)

    def read(
        self, name: str, shape: tuple[int, ...], start: int, stop: int, *, scratch: Scratch | None = None
    ) -> torch.Tensor:
        """Rows ``[start, stop)`` of the packed mask of ``name``, viewed with the parameter's ``shape``, in the
        stored bit field (uint8 or int32; the same bits)."""
        if self._memory is not None:
            return self._memory.packed[name].reshape(shape)[start:stop]
        assert self._file is not None
        return self._file.read_raw(name, start, stop, scratch=scratch)

    def check_shape(self, name: str, shape: tuple[int, ...], source: str) -> None:
        """Fail with a message naming the tensor when its mask does not fit the parameter."""
        mask_shape = self.shape(name)
        flat_ok = self._memory is not None and len(mask_shape) == 1 and mask_shape[0] == _numel(shape)
        if mask_shape != tuple(shape) and not flat_ok:
            raise MaskError(
                f"{self.path}: mask for {name!r} has shape {_shape_str(mask_shape)} but {source} has {_shape_str(shape)}"
            )
