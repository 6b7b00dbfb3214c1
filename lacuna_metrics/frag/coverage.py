"""FRAG on the checkpoint side: the preflight, the checkpoint tensor names of the measured vectors, the coverage.

The scorer reads checkpoint tensors, which transformers 5 can name differently from the loaded model's parameters
(fused experts saved per expert); this module links the two through :attr:`lacuna_metrics.weights.anatomy.Weight.input_key`
and reports what share of the block weights FRAG covers (docs/anatomy.md, "FRAG").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import torch

from lacuna_metrics.frag.targets import check_target
from lacuna_metrics.weights.anatomy import Anatomy, Weight, checkpoint_anatomy
from lacuna_metrics.weights.checkpoints import Checkpoint

__all__ = ["DEFAULT_MIN_COVERAGE", "coverage_verdict", "frag_preflight"]

#: Below this share of the block weights, FRAG's result carries a coverage warning.
DEFAULT_MIN_COVERAGE = 0.9


def _checkpoint_anatomy(checkpoint: Checkpoint, source: str) -> Anatomy:
    shapes = {n: checkpoint.shape(n) for n in checkpoint.names if not checkpoint.is_alias(n)}
    return checkpoint_anatomy(shapes, checkpoint.config(), source)


def frag_preflight(model_dir: str | os.PathLike[str], target: str = "all") -> Anatomy:
    """Check that FRAG can score ``model_dir`` for ``target`` from its tensor header and ``config.json`` alone.

    One-line ValueError naming the checkpoint when the target is unknown, the config has no
    ``num_hidden_layers``, no tensor name has a block index, or the target matches none of its block weights.
    Returns the checkpoint's anatomy. Reads no weights, so it costs milliseconds.
    """
    check_target(target)
    checkpoint = Checkpoint(model_dir)
    return _preflight(checkpoint, str(model_dir), target)


def _preflight(checkpoint: Checkpoint, source: str, target: str) -> Anatomy:
    anatomy = _checkpoint_anatomy(checkpoint, source)
    matrices = anatomy.block_matrix_names()
    if not matrices:
        raise ValueError(f"{source}: its transformer blocks hold no weight matrix (only 1-D tensors): nothing for FRAG")
    if target.startswith("regex:"):
        regex = re.compile(target.removeprefix("regex:"))
        hits = [n for n in matrices if regex.search(n)]
    elif target in ("attention", "mlp", "expert"):
        hits = [w.name for w in anatomy.select(target)]
    else:  # all, linear: the loaded model's structure decides
        hits = matrices
    if not hits:
        raise ValueError(
            f"{source}: --frag-target {target!r} matches none of its block weights ({anatomy.summary()}; "
            f"e.g. {', '.join(matrices[:3])})"
        )
    return anatomy


def _to_checkpoint(
    chosen: Sequence[Weight],
    skipped_model: dict[str, str],
    forget: dict[str, torch.Tensor],
    retain: dict[str, torch.Tensor],
    disk: Anatomy,
    checkpoint: Checkpoint,
    target: str,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], set[str], dict[str, Any]]:
    """Key the model's vectors by the checkpoint's tensor names and measure what they cover.

    A checkpoint tensor takes the vector of the model weight with its name; failing that (transformers 5 saves
    fused experts as per-expert matrices, and routers under other names), the vector of the model weight with the
    same :attr:`Weight.input_key` (row e of a fused expert vector for expert e), when the input widths agree.
    """
    by_name = {w.name: w for w in chosen}
    by_key: dict[tuple[Any, ...], tuple[Weight, int | None]] = {}
    for w in chosen:
        if w.fused_experts:
            for e in range(w.shape[0]):
                by_key.setdefault((w.layer, "expert", e, w.input_key[3]), (w, e))
        else:
            by_key.setdefault(w.input_key, (w, None))
    regex = re.compile(target.removeprefix("regex:")) if target.startswith("regex:") else None
    allowed = None if target in ("all", "linear") or regex else {w.name for w in disk.select(target)}
    blocks = set(disk.block_matrix_names())
    out_f: dict[str, torch.Tensor] = {}
    out_r: dict[str, torch.Tensor] = {}
    transposed: set[str] = set()
    skipped: dict[str, str] = {}
    for name in checkpoint.names:
        if checkpoint.is_alias(name) or (name not in blocks and name not in by_name):
            continue
        shape = checkpoint.shape(name)
        if regex is not None and not regex.search(name):
            skipped[name] = f"not matched by target {target!r}"
            continue
        if allowed is not None and name not in allowed and name not in by_name:
            skipped[name] = f"outside target {target!r}"
            continue
        w = by_name.get(name)
        if w is not None and tuple(w.shape) == tuple(shape):
            out_f[name], out_r[name] = forget[name], retain[name]
            if w.transposed:
                transposed.add(name)
            continue
        dw = disk.weights.get(name)
        match = by_key.get(dw.input_key) if dw is not None and dw.is_matrix and not dw.fused_experts else None
        if match is not None and dw is not None:
            mw, e = match
            xf, xr = (forget[mw.name], retain[mw.name]) if e is None else (forget[mw.name][e], retain[mw.name][e])
            if xf.dim() == 1 and xf.numel() == dw.input_dim:
                out_f[name], out_r[name] = xf.clone(), xr.clone()
                if dw.transposed:
                    transposed.add(name)
                continue
        if name in skipped_model:
            skipped[name] = skipped_model[name]
        elif dw is None:
            skipped[name] = "not a projection the name rules or the model structure recognise"
        elif target == "linear":
            skipped[name] = "not an nn.Linear / Conv1D module weight (target 'linear')"
        else:
            skipped[name] = "no module of the loaded model computes it"
    coverage = _coverage(out_f, skipped, blocks, disk, checkpoint, target)
    return out_f, out_r, transposed, coverage


def _coverage(
    scored: dict[str, torch.Tensor],
    skipped: dict[str, str],
    blocks: set[str],
    disk: Anatomy,
    checkpoint: Checkpoint,
    target: str,
) -> dict[str, Any]:
    def numel(name: str) -> int:
        return int(checkpoint.info(name).numel)

    block_scalars = sum(numel(n) for n in blocks)
    included = [n for n in scored if n in blocks]
    scalars = sum(numel(n) for n in included)
    by_component: dict[str, dict[str, int]] = {}
    for n in blocks:
        w = disk.weights.get(n)
        entry = by_component.setdefault(w.component if w is not None else "other", {"tensors": 0, "scalars": 0})
        entry["tensors"] += 1
        entry["scalars"] += numel(n)
    for n in included:
        w = disk.weights.get(n)
        entry = by_component[w.component if w is not None else "other"]
        entry["scored_tensors"] = entry.get("scored_tensors", 0) + 1
        entry["scored_scalars"] = entry.get("scored_scalars", 0) + numel(n)
    reasons: dict[str, dict[str, Any]] = {}
    for n, reason in skipped.items():
        if n not in blocks:
            continue
        entry = reasons.setdefault(reason, {"tensors": 0, "scalars": 0, "examples": []})
        entry["tensors"] += 1
        entry["scalars"] += numel(n)
        if len(entry["examples"]) < 3:
            entry["examples"].append(n)
    return {
        "target": target,
        "modules": len(scored),
        "block_modules": len(included),
        "block_weights": len(blocks),
        "scalars": scalars,
        "block_scalars": block_scalars,
        "share": scalars / block_scalars if block_scalars else 0.0,
        "outside_blocks": len(scored) - len(included),
        "by_component": {c: by_component[c] for c in sorted(by_component)},
        "skipped": reasons,
        "definition": "share = scalars of the scored block weights / scalars of every tensor with 2+ dimensions "
        "inside a transformer block except biases (docs/anatomy.md)",
    }


def coverage_verdict(coverage: dict[str, Any], min_coverage: float = DEFAULT_MIN_COVERAGE) -> dict[str, Any]:
    """``coverage`` plus ``threshold``, ``below_threshold`` and a one-line ``warning`` (None when covered)."""
    if not 0.0 <= float(min_coverage) <= 1.0:
        raise ValueError(f"min_coverage must be in [0, 1], got {min_coverage}")
    out = dict(coverage)
    share = float(out.get("share", 0.0))
    below = share < float(min_coverage)
    out["threshold"] = float(min_coverage)
    out["below_threshold"] = below
    warning = None
    if below:
        left = sorted(out.get("skipped", {}).items(), key=lambda kv: -kv[1]["scalars"])
        why = "; ".join(f"{v['tensors']} skipped: {reason}" for reason, v in left[:2]) or "nothing skipped"
        warning = (
            f"FRAG covers only {share:.1%} of the block weights ({out.get('block_modules', 0)} of "
            f"{out.get('block_weights', 0)} tensors, target {out.get('target')!r}; threshold {min_coverage:.0%}): {why}"
        )
    out["warning"] = warning
    return out
