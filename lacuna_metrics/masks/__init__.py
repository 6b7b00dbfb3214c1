"""LACUNA parameter masks: build, bit-pack, save, and load them (ours and the released ``mask.pt``).

A mask set assigns each scalar of an *eligible* weight tensor to at most one of ``num_groups`` groups; during
masked pretraining the data of group ``g`` may update only its scalars, so we know where each person's knowledge
was written. That ground truth is what the localization metrics score.

This module is the stable import path of the mask API; each concept has its own module:

* :mod:`lacuna_metrics.masks.mask_set`: :class:`MaskSet`, the group/bit arithmetic, the names of a tensor's layer and
  component, and the manifest statistics (:func:`trivial_mask_stats`);
* :mod:`lacuna_metrics.masks.build`: which tensors are eligible and the seeded draw (:func:`build_masks`);
* :mod:`lacuna_metrics.masks.files`: the safetensors format, the released ``mask.pt``, :class:`MaskReader`.

Definitions: ``docs/definitions.md``, sections ``#checkpoints-and-mask-files`` (``mask.pt``), ``#lacuna-masks``
(construction), ``#oraclegrad`` (forget mask), ``#localization-precision`` (parameter universe).
"""

from __future__ import annotations

from lacuna_metrics.masks.build import (
    DEFAULT_ELIGIBLE_PATTERN,
    LACUNA_RELEASE_PATTERN,
    build_masks,
    eligible_parameters,
)
from lacuna_metrics.masks.files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MODEL_KEY,
    MaskReader,
    load_masks,
    mask_num_groups,
    save_masks,
    stamp_masks,
    storage_dtype,
)
from lacuna_metrics.masks.mask_set import (
    MAX_GROUPS,
    MaskError,
    MaskSet,
    Shapes,
    component,
    group_bits,
    layer_index,
    named_shapes_of,
    trivial_mask_stats,
)

__all__ = [
    "DEFAULT_ELIGIBLE_PATTERN",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LACUNA_RELEASE_PATTERN",
    "MAX_GROUPS",
    "MODEL_KEY",
    "mask_num_groups",
    "MaskError",
    "MaskReader",
    "MaskSet",
    "Shapes",
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
