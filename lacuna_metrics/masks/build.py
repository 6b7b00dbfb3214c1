"""Building LACUNA's masks: which tensors are eligible, and the seeded random draw of disjoint per-scalar groups.

Kept apart from the bit semantics (:mod:`lacuna_metrics.masks.mask_set`) and the files (:mod:`lacuna_metrics.masks.files`)
because it is the one place that must reproduce the released ``create_masks`` bit for bit
(docs/definitions.md#lacuna-masks).
"""

from __future__ import annotations

import re

import torch

from lacuna_metrics.masks.mask_set import (
    MaskError,
    MaskSet,
    Shapes,
    _as_shapes,
    _bit_table,
    _check_num_groups,
    _numel,
    layer_index,
)
from lacuna_metrics.weights.anatomy import PROJECTION_WEIGHT_PATTERN

__all__ = ["DEFAULT_ELIGIBLE_PATTERN", "LACUNA_RELEASE_PATTERN", "build_masks", "eligible_parameters"]

#: Attention and MLP weight matrices of transformer blocks, from the name rules of :mod:`lacuna_metrics.weights.anatomy`
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
