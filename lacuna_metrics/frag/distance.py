"""Global L2 weight distance: the baseline FRAG is compared against (docs/definitions.md#distance-baseline).

    L2 = sqrt( sum over all shared tensors of ||W_unl - W||_F^2 )

over ALL weights, embeddings and norms included. Like FRAG it needs only sums, so tensors are streamed in row
blocks. Per tensor we also report ||dW||_F and the relative change ||dW||_F / ||W||_F, which shows where an
unlearning method moved the weights.

Tied weights: a checkpoint reader exposes a tied ``lm_head.weight`` as an alias of the embedding. Callers must
skip aliases (``Checkpoint.is_alias``) or the embedding delta is counted twice; :func:`distance_score` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lacuna_metrics.kernels import diff_square_sums
from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError, check_compatible
from lacuna_metrics.weights.pair_walk import walk_pair

__all__ = ["DistanceAccumulator", "distance_score"]


class DistanceAccumulator:
    """Accumulate ||W_unl - W||_F^2 and ||W||_F^2 per tensor (float64), block by block.

    Feed every tensor once, as consecutive leading-dimension row blocks; do not add tied aliases (see module doc).
    """

    def __init__(self) -> None:
        self._delta_sq: dict[str, float] = {}
        self._norm_sq: dict[str, float] = {}
        self._rows: dict[str, int] = {}

    @property
    def rows_seen(self) -> dict[str, int]:
        """Leading-dimension rows received so far per tensor."""
        return dict(self._rows)

    def add(self, name: str, before_rows: torch.Tensor, after_rows: torch.Tensor) -> None:
        """Add a block of rows of W (``before_rows``) and W_unl (``after_rows``) of tensor ``name``."""
        before = torch.as_tensor(before_rows)
        after = torch.as_tensor(after_rows)
        if before.shape != after.shape:
            raise ValueError(f"tensor {name!r}: before block {list(before.shape)} vs after block {list(after.shape)}")
        if before.dtype not in (torch.float32, torch.float64) or after.dtype != before.dtype:
            before, after = before.to(torch.float64), after.to(torch.float64)  # exact for bf16/fp16
        delta_sq, norm_sq = diff_square_sums(
            before.reshape(-1).contiguous().numpy(), after.reshape(-1).contiguous().numpy()
        )
        self._delta_sq[name] = self._delta_sq.get(name, 0.0) + float(delta_sq)
        self._norm_sq[name] = self._norm_sq.get(name, 0.0) + float(norm_sq)
        self._rows[name] = self._rows.get(name, 0) + (before.shape[0] if before.dim() else 1)

    def result(self) -> dict[str, Any]:
        """Global L2 and per-tensor / per-module distances.

        ``relative`` is ||dW||/||W||, 0 when both are 0, and None when W is 0 but moved (its name is then listed in
        ``relative_undefined``). ``per_module`` sums weight and bias of a module (name minus its last component).
        """
        if not self._delta_sq:
            raise ValueError("distance: no tensors were added")
        per_tensor: dict[str, dict[str, float | None]] = {}
        per_module_sq: dict[str, float] = {}
        undefined: list[str] = []
        for name, dsq in self._delta_sq.items():
            nsq = self._norm_sq[name]
            if nsq > 0.0:
                relative: float | None = math.sqrt(dsq) / math.sqrt(nsq)
            elif dsq == 0.0:
                relative = 0.0
            else:
                relative = None
                undefined.append(name)
            per_tensor[name] = {"l2": math.sqrt(dsq), "relative": relative}
            module = name.rsplit(".", 1)[0] if "." in name else name
            per_module_sq[module] = per_module_sq.get(module, 0.0) + dsq
        total = math.fsum(self._delta_sq.values())
        return {
            "l2": math.sqrt(total),
            "l2_squared": total,
            "tensors": len(self._delta_sq),
            "per_tensor": per_tensor,
            "per_module": {m: math.sqrt(v) for m, v in per_module_sq.items()},
            "relative_undefined": undefined,
        }


def distance_score(before: Checkpoint, after: Checkpoint, block_elems: int = 4_000_000) -> dict[str, Any]:
    """Global L2 distance between two checkpoints over all tensors they share, streamed block by block
    (:func:`~lacuna_metrics.weights.pair_walk.walk_pair`; ``lacuna score`` feeds a :class:`DistanceAccumulator` from its
    own walk instead).

    Tied aliases are skipped (a name that is an alias in ``before`` is scored only if ``after`` stores it as a real
    tensor, i.e. the unlearning untied it). Tensors present in only one checkpoint are not scored; they are listed
    under ``unshared``. Shared tensors must have equal shapes.
    """
    if block_elems < 1:
        raise ValueError(f"block_elems must be >= 1, got {block_elems}")
    after_names, before_names = set(after.names), set(before.names)
    # A tied alias is skipped unless the other side stores that tensor for real (tied before, untied after).
    shared = [n for n in before.names if n in after_names and not (before.is_alias(n) and after.is_alias(n))]
    if not shared:
        raise CheckpointError(f"{before.path} and {after.path} share no tensors")
    unshared = [n for n in before.names if n not in after_names and not before.is_alias(n)]
    unshared += [n for n in after.names if n not in before_names and not after.is_alias(n)]
    check_compatible({"before": before, "after": after}, names=shared)
    acc = DistanceAccumulator()
    walk_pair(before, after, shared, [acc.add], block_elems=block_elems, desc="L2 distance")
    out = acc.result()
    out["unshared"] = unshared
    return out
