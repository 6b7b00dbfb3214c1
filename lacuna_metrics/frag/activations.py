"""FRAG's activation statistics of a model directory: x^f and x^r of the ORIGINAL model, cached, keyed by the
checkpoint's tensor names (docs/definitions.md#frag-activation-statistics).

FRAG weighs each weight W_ij by how much its input channel j fires on forget text versus retain text; this module
is the end-to-end entry (:func:`activation_stats`) and the stable import path of the pieces, each in its own module:

* :mod:`lacuna_metrics.frag.targets`: which weights a target scores (:func:`frag_weights`, :data:`FRAG_TARGETS`);
* :mod:`lacuna_metrics.frag.activation_norms`: the norms measured on a loaded model (:func:`collect_input_norms`);
* :mod:`lacuna_metrics.frag.calibration_texts`: the texts they are measured on (:func:`calibration_texts`);
* :mod:`lacuna_metrics.frag.activation_cache`: :class:`ActivationStats` and its on-disk cache;
* :mod:`lacuna_metrics.frag.coverage`: the preflight, the checkpoint names and the coverage.

Definitions: ``docs/definitions.md#frag-activation-statistics`` (x_j), ``#frag-score`` (which layers are scored),
``docs/anatomy.md`` ("FRAG").
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from lacuna_metrics.frag.activation_cache import (
    FORMAT_VERSION,
    ActivationStats,
    NormTable,
    _cache_path,
    _fingerprint,
    _load_cache,
    _save_cache,
)
from lacuna_metrics.frag.activation_norms import _collect, collect_input_norms, eval_mode, model_device
from lacuna_metrics.frag.calibration_texts import calibration_fields, calibration_texts
from lacuna_metrics.frag.coverage import (
    DEFAULT_MIN_COVERAGE,
    _preflight,
    _to_checkpoint,
    coverage_verdict,
    frag_preflight,
)
from lacuna_metrics.frag.targets import (
    ALL_PROJECTIONS,
    FRAG_TARGETS,
    FRP_TARGETS,
    MLP_PROJECTIONS,
    _frag_plan,
    check_target,
    frag_weights,
    linear_weight_names,
    transposed_weight_names,
)
from lacuna_metrics.weights.checkpoints import Checkpoint

__all__ = [
    "ALL_PROJECTIONS",
    "DEFAULT_MIN_COVERAGE",
    "FORMAT_VERSION",
    "FRAG_TARGETS",
    "MLP_PROJECTIONS",
    "FRP_TARGETS",
    "ActivationStats",
    "NormTable",
    "activation_stats",
    "calibration_fields",
    "calibration_texts",
    "check_target",
    "collect_input_norms",
    "coverage_verdict",
    "eval_mode",
    "frag_preflight",
    "frag_weights",
    "linear_weight_names",
    "model_device",
    "transposed_weight_names",
]


def _dtype_kwarg() -> str:
    """``dtype`` on transformers >= 4.56, ``torch_dtype`` before (the old name warns on 5.x)."""
    import transformers
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def activation_stats(
    model_dir: str | os.PathLike[str],
    forget_texts: Sequence[str],
    retain_texts: Sequence[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    target: str = "all",
    max_length: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    tokenizer_dir: str | os.PathLike[str] | None = None,
    calib_fields: Sequence[str] | None = None,
    calib_retain_fields: Sequence[str] | None = None,
    checkpoint: Checkpoint | None = None,
) -> ActivationStats:
    """x^f and x^r of the ORIGINAL model in ``model_dir`` (docs/definitions.md#frag-activation-statistics), cached in
    ``cache_dir`` if given.

    Keys are the checkpoint's tensor names (what the scorer reads), which for transformers 5 MoE checkpoints differ
    from the loaded model's parameter names (see :func:`lacuna_metrics.frag.coverage._to_checkpoint`). ``coverage``
    reports the share of the block weights scored and what was skipped and why (docs/anatomy.md). Before any work
    (no weights read), :func:`frag_preflight` checks the target, the config's ``num_hidden_layers`` and the blocks.

    The cache file ``<cache_dir>/<hex digest>.safetensors`` (keys ``forget/<weight>`` and ``retain/<weight>``) is
    keyed by a SHA-256 fingerprint of the weights, config and tokenizer files, the texts, ``target``,
    ``max_length``, ``dtype`` and :data:`FORMAT_VERSION`, and the fields the texts were selected by
    (``calib_fields`` for the forget texts, ``calib_retain_fields`` for the retain texts; provenance of the texts,
    see :func:`calibration_texts`; None = every field, the key of earlier versions). A hit does not load the model.
    The model is loaded from local files only, without remote code, and freed before returning. ``checkpoint``: the
    caller's open :class:`Checkpoint` of ``model_dir``, whose fingerprint is hashed once and cached on it (``lacuna
    score`` passes ``--before``'s, so the weights are not hashed a second time for the cache key).
    """
    model_path = Path(model_dir)
    if not model_path.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_path}")
    tok_path = Path(tokenizer_dir) if tokenizer_dir is not None else model_path
    forget_texts, retain_texts = list(forget_texts), list(retain_texts)
    if not forget_texts:
        raise ValueError(f"activation_stats({model_path}): no forget calibration texts")
    if not retain_texts:
        raise ValueError(f"activation_stats({model_path}): no retain calibration texts")
    check_target(target)
    if checkpoint is None:
        checkpoint = Checkpoint(model_path)
    elif checkpoint.path.resolve() != model_path.resolve():
        raise ValueError(f"activation_stats({model_path}): the checkpoint given is {checkpoint.path}, another model")
    disk = _preflight(checkpoint, str(model_path), target)
    fields = {"forget": calibration_fields(calib_fields), "retain": calibration_fields(calib_retain_fields)}
    fingerprint = _fingerprint(
        checkpoint, model_path, tok_path, forget_texts, retain_texts, target, max_length, dtype, fields
    )
    cache_file = _cache_path(Path(cache_dir), fingerprint) if cache_dir is not None else None
    if cache_file is not None and cache_file.is_file():
        hit = _load_cache(cache_file, fingerprint)
        if hit is not None:
            return hit

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tok_path, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, trust_remote_code=False, **{_dtype_kwarg(): dtype}
    )
    try:
        model_target = "all" if target.startswith("regex:") else target
        try:
            chosen, skipped_model = _frag_plan(model, model_target)
        except ValueError as exc:
            raise ValueError(f"{model_path}: {exc}") from None
        if not chosen:
            raise ValueError(f"{model_path}: --frag-target {target!r} selects no projection the model computes")
        forget = _collect(model, tokenizer, forget_texts, chosen, max_length=max_length, dtype=dtype)
        retain = _collect(model, tokenizer, retain_texts, chosen, max_length=max_length, dtype=dtype)
    finally:
        del model
        gc.collect()
    forget, retain, transposed, coverage = _to_checkpoint(
        chosen, skipped_model, forget, retain, disk, checkpoint, target
    )
    if not forget:
        raise ValueError(f"{model_path}: --frag-target {target!r}: no checkpoint tensor matches a measured projection")
    stats = ActivationStats(
        forget, retain, fingerprint, cached=False, conv1d_transposed=frozenset(transposed), coverage=coverage
    )
    if cache_file is not None:
        _save_cache(cache_file, stats)
    return stats
