"""Statistics of one (layer, component) group, for the scores normalised by them (docs/definitions.md#localization-precision).

``layernorm`` and ``contrastln`` divide by σ of δ and of the contrast over *every* attention/MLP tensor of the
group in the checkpoint pair (in the universe or not: a masked tensor without forget scalars, an unmasked one; as
in the release's first pass), ``compnorm`` by the tensor's mean control δ′. The scorer collects per-block sums
while it reads the group (:func:`control_sums` and :func:`~lacuna_metrics.kernels.pair_pass`'s sums) and folds
them here in file order (:func:`fold_group`), so no number depends on the thread count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lacuna_metrics.kernels import TABLE_KEYS, bf16_value_counts
from lacuna_metrics.localization.auc import FORGET, OUTSIDE, RETAIN
from lacuna_metrics.localization.families import GROUP_NORMALISED, group_normalised
from lacuna_metrics.masks import component, layer_index

if TYPE_CHECKING:
    from lacuna_metrics.localization.sinks import ScoreSinks

__all__ = [
    "GroupScoring",
    "GroupStats",
    "TensorState",
    "control_sums",
    "fold_group",
    "group_key",
    "group_normalised",
    "score_buffered",
]

#: One block's sums, keyed by block number: (tensor name, pair_pass sums, control_sums).
BlockSums = Mapping[int, tuple[str, np.ndarray, list[float]]]


@dataclass
class GroupStats:
    """First-pass sums of one (layer, component) group: the σ sums over *every* tensor of the group
    (docs/definitions.md#localization-precision and the release: all attention/MLP tensors of the layer, in the
    universe or not), the scalar counts and the update energy over its universe tensors."""

    n: int = 0  # universe scalars
    n_sigma: int = 0  # every scalar of the group: the σs' population
    delta: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σδ, Σδ² (every tensor of the group)
    contrast: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σc, Σc² (every tensor of the group)
    energy: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # ΣΔ² outside / retain / forget (universe)
    counts: list[int] = field(default_factory=lambda: [0, 0, 0])  # universe scalars outside / retain / forget

    def sigma(self, which: str) -> float:
        """Population std (ddof=0) of ``"delta"`` or ``"contrast"`` over the group."""
        s, s2 = getattr(self, which)
        if self.n_sigma == 0:
            return 0.0
        var = max(0.0, s2 / self.n_sigma - (s / self.n_sigma) ** 2)
        return math.sqrt(var)


def group_key(name: str) -> tuple[int, str]:
    """The (layer, component) group of an attention/MLP tensor (``layernorm``'s σ is per group)."""
    return (layer_index(name) or 0, str(component(name)))


def control_sums(b: Mapping[str, torch.Tensor]) -> list[float]:
    """Σ|δ′| of the control pair and Σc, Σc² of the contrast c = |δ| − |δ′| of one block (float64)."""
    if "control_before" not in b:
        return [0.0, 0.0, 0.0]
    delta = (b["after"] - b["before"]).reshape(-1).double().abs()
    dc = (b["control_after"] - b["control_before"]).reshape(-1).double().abs()
    contrast = delta - dc
    return [float(dc.sum()), float(contrast.sum()), float((contrast * contrast).sum())]


def fold_group(
    names: Sequence[str], members: Sequence[str], per_block: BlockSums
) -> tuple[GroupStats, dict[str, float]]:
    """Fold a group's per-block sums (in file order) into its statistics and the members' mean control δ′.

    The σ sums run over every tensor of the group (``names``), the counts and update energy over its universe
    ``members``; both in file order, so the sums do not depend on which tensors are scored.
    """
    per_tensor: dict[str, dict[str, Any]] = {}
    for seq in sorted(per_block):
        name, sums, control = per_block[seq]
        t = per_tensor.setdefault(name, {"d": [0.0, 0.0], "c": [0.0, 0.0], "dc": 0.0, "e": [0.0] * 3, "k": [0] * 3})
        t["d"][0] += float(sums[0])
        t["d"][1] += float(sums[1])
        for c in (OUTSIDE, RETAIN, FORGET):
            t["e"][c] += float(sums[2 + c])
            t["k"][c] += int(sums[5 + c])
        t["dc"] += control[0]
        t["c"][0] += control[1]
        t["c"][1] += control[2]
    stats = GroupStats()
    for n in names:
        t = per_tensor[n]
        stats.n_sigma += sum(t["k"])
        for i in range(2):
            stats.delta[i] += t["d"][i]
            stats.contrast[i] += t["c"][i]
    for n in members:
        t = per_tensor[n]
        stats.n += sum(t["k"])
        for c in range(3):
            stats.energy[c] += t["e"][c]
            stats.counts[c] += t["k"][c]
    control_mean = {n: per_tensor[n]["dc"] / max(1, sum(per_tensor[n]["k"])) for n in members}
    return stats, control_mean


@dataclass
class TensorState:
    """A member tensor being scored: whole-tensor buffers (categories, qtile/crossfield inputs, a buffered group's
    δ and contrast), its composite sample, and how many of its blocks are still to be scored."""

    full: dict[str, torch.Tensor]
    sample: np.ndarray
    blocks_left: int


@dataclass
class GroupScoring:
    """What scoring one (layer, component) group needs: its σs, its tensors, and the samples by block number.

    ``buffered``: the group is scored while it is read, except the :data:`GROUP_NORMALISED` scores, whose σ and
    means are known only after its last block; its tensors keep δ (and the contrast) for them, and the
    composite's samples keep their rows so that those features are filled in then (:func:`score_buffered`)."""

    key: tuple[int, str]
    sigma: float
    sigma_contrast: float
    buffered: bool = False
    tensors: dict[str, TensorState] = field(default_factory=dict)
    samples: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    sample_rows: dict[int, tuple[str, np.ndarray]] = field(default_factory=dict)  # buffered: block -> rows


def score_buffered(
    scoring: GroupScoring,
    stats: GroupStats | None,
    control_mean: Mapping[str, float],
    *,
    scores: Sequence[str],
    features: Sequence[str],
    step: int,
    sinks: ScoreSinks,
) -> None:
    """A buffered group's :data:`GROUP_NORMALISED` scores among ``scores`` from its tensors' δ and contrast, now
    that its σs and the tensors' mean control δ′ are known, and those composite ``features``; then its buffers are
    freed. ``layernorm`` and ``compnorm`` are functions of δ alone, so a bf16 pair's few distinct δ values are each
    scored once, with their counts.

    One task: the scores share accumulators (one lock each), so splitting it would only make workers wait."""
    if stats is None:  # no member tensors
        return
    sigma, sigma_contrast = stats.sigma("delta"), stats.sigma("contrast")
    todo = [s for s in GROUP_NORMALISED if s in scores]
    later = [(j, f) for j, f in enumerate(features) if f in GROUP_NORMALISED]

    def normalised(name: str, rows: slice | torch.Tensor, wanted: Sequence[str]) -> dict[str, torch.Tensor]:
        full = scoring.tensors[name].full
        contrast = full["contrast"][rows] if "contrast" in full else None
        mean = control_mean.get(name, 0.0)
        return group_normalised(full["delta"][rows], contrast, sigma, sigma_contrast, mean, wanted=wanted)

    by_value = [s for s in todo if s != "contrastln"]  # functions of δ alone: one update per distinct δ
    rest = np.empty(step, dtype=np.int64)
    for name, state in scoring.tensors.items():
        full, table = state.full, np.zeros(TABLE_KEYS * 3, dtype=np.int64)
        for start in range(0, full["cats"].numel() if todo else 0, step):
            rows = slice(start, start + step)
            cats = full["cats"][rows]
            if "contrastln" in todo:
                sinks.add_all([(sinks.acc["contrastln"], normalised(name, rows, ["contrastln"])["contrastln"])], cats)
            if by_value:  # the δ that are no bf16 value are scored one by one
                m = bf16_value_counts(full["delta"][rows].numpy(), cats.numpy(), table, rest)
                if m:
                    picked = torch.from_numpy(rest[:m]) + start
                    values = normalised(name, picked, by_value)
                    sinks.add_all([(sinks.acc[s], values[s]) for s in by_value], full["cats"][picked])
        if table.any():  # the bf16 values of δ, each scored once and added with its count
            nz = np.flatnonzero(table)
            values = torch.from_numpy((nz // 3 << 16).astype(np.int32)).view(torch.float32)
            mean = control_mean.get(name, 0.0)
            scored = group_normalised(values, None, sigma, sigma_contrast, mean, wanted=by_value)
            value_cats, weights = torch.from_numpy((nz % 3).astype(np.uint8)), torch.from_numpy(table[nz])
            for s in by_value:
                with sinks.lock(sinks.acc[s]):
                    sinks.acc[s].add_counts(scored[s], value_cats, weights)
    for seq, (name, rows) in scoring.sample_rows.items():
        values = normalised(name, torch.from_numpy(rows), [f for _, f in later])
        sample = scoring.samples[seq][0]
        for j, f in later:
            sample[:, j] = values[f].double().numpy()
    for state in scoring.tensors.values():
        state.full = {}
