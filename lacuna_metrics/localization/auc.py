"""Exact ROC-AUC (Mann-Whitney with ties counted one half), in memory and streaming, validated against scikit-learn."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lacuna_metrics.kernels import (
    TABLE_KEYS,
    clear_bins,
    fold_table,
    histogram_add,
    histogram_add_counts,
    merge_bins,
    occupied_bins,
    qtile_histogram_add,
    qtile_ties_histogram_add,
    qtile_ties_values,
)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC-AUC of ``scores`` for binary ``labels``; NaN scores and one-class labels are errors."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores ({scores.shape}) and labels ({labels.shape}) differ in shape")
    if np.isnan(scores).any():
        raise ValueError("scores contain NaN")
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ROC-AUC needs both classes (positives={n_pos}, negatives={n_neg})")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average ranks (1-based) over runs of equal scores
    boundaries = np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]) + 1  # not np.diff: inf - inf is NaN
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [scores.size]))
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(scores.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# --------------------------------------------------------------------------------------------------
# Streaming ROC-AUC over billions of scalars

#: Category codes of a scalar in the localization universe (from its mask bits).
OUTSIDE, RETAIN, FORGET = 0, 1, 2
#: Which categories are positives / negatives for each target (docs/definitions.md#localization-precision, with
#: ``forget_vs_retain``).
TARGETS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "forget": ((FORGET,), (RETAIN, OUTSIDE)),
    "unified": ((FORGET, RETAIN), (OUTSIDE,)),
    "forget_vs_retain": ((FORGET,), (RETAIN,)),
}
_NCAT = 3
_BAD_CATEGORY = f"category codes must be {OUTSIDE}, {RETAIN} or {FORGET}, got {{}}"


def float_keys(scores: torch.Tensor) -> torch.Tensor:
    """Map float32 scores to int64 keys in ``[0, 2**32)`` with the same order (−0 and +0 share a key)."""
    return signed_keys(scores).to(torch.int64) + (1 << 31)


def signed_keys(scores: torch.Tensor) -> torch.Tensor:
    """Order-preserving int32 keys of float32 scores (``float_keys − 2**31``), −0 and +0 equal."""
    x = scores.reshape(-1).to(torch.float32)
    bits = x.view(torch.int32)
    if not bool((bits < 0).any()):  # non-negative scores (most of them): the bits are already the key
        return bits
    bits = (x + 0.0).view(torch.int32)  # -0.0 + 0.0 == +0.0
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def qtile_values(start: int, stop: int, n: int) -> torch.Tensor:
    """``qtile`` of ranks ``[start, stop)`` in a tensor of ``n`` scalars: rank / (n − 1) as float32."""
    return (torch.arange(start, stop, dtype=torch.float64) / max(1, n - 1)).to(torch.float32)


def _raise_rejected(code: int, cats: torch.Tensor) -> None:
    """The error for a histogram kernel's return code (−1: added; ``i`` ≥ 0: NaN at ``i``; −2 − i: bad category)."""
    if code >= 0:
        raise ValueError(f"scores contain NaN (at index {code} of the block)")
    if code < -1:
        raise ValueError(_BAD_CATEGORY.format(int(cats[-2 - code])))


@dataclass
class AUCResult:
    """One ROC-AUC with a rigorous bound on its distance to the exact Mann-Whitney value."""

    value: float | None
    error_bound: float
    n_pos: int
    n_neg: int

    @property
    def exact(self) -> bool:
        return self.error_bound == 0.0


class StreamingAUC:
    """ROC-AUC of float32 scores for the three localization targets at once, fed chunk by chunk.

    Up to ``exact_limit`` scalars are buffered and the AUC is exact (ties count one half, as
    ``sklearn.metrics.roc_auc_score``). Beyond that, the buffer spills into a histogram over the
    top ``bits`` bits of each score's order-preserving 32-bit key, one count per category. Pairs in
    different bins are then still ordered exactly; pairs inside one bin count one half, which is exact
    when the bin holds a single distinct value. The smallest and largest low-order key bits seen per
    bin tell exactly which bins hold several values; there, only pairs involving a key off the bin's
    lower edge can be misordered, and half their count over ``P·N`` bounds the error rigorously
    (reported; often 0 for scores of bf16 weights, whose low mantissa bits are zero).
    """

    def __init__(self, bits: int = 20, exact_limit: int = 1 << 22) -> None:
        if not 8 <= bits <= 26:
            raise ValueError(f"bits must be in [8, 26], got {bits}")
        self.bits = bits
        self.exact_limit = exact_limit
        self._shift = 32 - bits
        self._scores: list[torch.Tensor] | None = []
        self._cats: list[torch.Tensor] = []
        self._buffered = 0
        self._bins: tuple[np.ndarray, np.ndarray] | None = None  # _binned()'s result until the next add
        self._counts: torch.Tensor | None = None  # [bins * 3] int64
        self._low_min: torch.Tensor | None = None  # [bins] smallest nonzero low-order key bits per bin
        self._low_max: torch.Tensor | None = None  # [bins] largest (-1: none)
        self._off_edge: torch.Tensor | None = None  # [bins * 3] counts of keys not on their bin's lower edge
        self._table: np.ndarray | None = None  # histogram_add's side table of bf16-like keys, folded on demand
        self._table_used = False
        self._spare: tuple[Any, ...] | None = None  # cleared histogram arrays kept by reset()

    @property
    def count(self) -> int:
        if self._counts is not None:
            self._fold()
            return int(self._counts.sum())
        return self._buffered

    def add(self, scores: torch.Tensor, cats: torch.Tensor) -> None:
        """Add float scores and their uint8 categories (same number of elements)."""
        scores = scores.reshape(-1).to(torch.float32)
        cats = cats.reshape(-1).to(torch.uint8)
        if scores.numel() != cats.numel():
            raise ValueError(f"{scores.numel()} scores but {cats.numel()} categories")
        self._bins = None
        if self._scores is not None:
            if cats.numel() and int(cats.max()) > FORGET:
                raise ValueError(_BAD_CATEGORY.format(int(cats.max())))
            if bool(torch.isnan(scores).any()):
                raise ValueError("scores contain NaN")
            self._scores.append(scores.clone())
            self._cats.append(cats.clone())
            self._buffered += scores.numel()
            if self._buffered > self.exact_limit:
                self._spill()
            return
        self._histogram(scores, cats)

    def expect(self, total: int) -> None:
        """Announce that ``total`` scalars will be added: beyond ``exact_limit`` they would spill into the
        histogram anyway, so start there and skip buffering (and copying) the first ``exact_limit`` of them.
        The result is the same as without the call."""
        if self._scores is not None and total > self.exact_limit:
            self._spill()

    def _spill(self) -> None:
        assert self._scores is not None
        buffered, cats = self._scores, self._cats
        self._scores, self._cats = None, []
        if self._spare is not None:  # cleared by reset()
            self._counts, self._off_edge, self._low_min, self._low_max, self._table = self._spare
            self._spare = None
        else:
            # np.zeros maps untouched zero pages (calloc): only the bins a run occupies ever cost memory or time
            self._counts = torch.from_numpy(np.zeros((1 << self.bits) * _NCAT, dtype=np.int64))
            self._low_min = torch.full((1 << self.bits,), 1 << self._shift, dtype=torch.int64)
            self._low_max = torch.full((1 << self.bits,), -1, dtype=torch.int64)
            self._off_edge = torch.from_numpy(np.zeros((1 << self.bits) * _NCAT, dtype=np.int64))
            self._table = np.zeros(TABLE_KEYS * _NCAT, dtype=np.int64)
        for s, c in zip(buffered, cats, strict=True):
            self._histogram(s, c)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The spilled histogram as the kernels take it (side table folded in): counts, off-edge counts, low-bit
        minima and maxima."""
        self._fold()
        return self._raw_arrays()

    def _raw_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        assert self._counts is not None and self._off_edge is not None
        assert self._low_min is not None and self._low_max is not None
        return self._counts.numpy(), self._off_edge.numpy(), self._low_min.numpy(), self._low_max.numpy()

    def _fold(self) -> None:
        """Move the side table's counts into the histogram (cheap: 32768 entries, once per read-out)."""
        if self._table_used:
            assert self._table is not None
            fold_table(self._table, self._shift, 1 << (self.bits - 1), *self._raw_arrays())
            self._table_used = False

    def _histogram(self, scores: torch.Tensor, cats: torch.Tensor) -> None:
        half = 1 << (self.bits - 1)
        self._table_used = True
        nan_at = histogram_add(
            scores.contiguous().numpy(), cats.contiguous().numpy(), self._shift, half, *self._raw_arrays(), self._table
        )
        _raise_rejected(nan_at, cats)

    def add_counts(self, scores: torch.Tensor, cats: torch.Tensor, weights: torch.Tensor) -> None:
        """Add each score ``weights[i]`` times (int64 ≥ 0): the same as :meth:`add` of the repeated scores, for a
        function of few distinct values (their counts), at the cost of one update per value."""
        scores = scores.reshape(-1).to(torch.float32)
        cats = cats.reshape(-1).to(torch.uint8)
        weights = weights.reshape(-1).to(torch.int64)
        if not scores.numel() == cats.numel() == weights.numel():
            raise ValueError(f"{scores.numel()} scores, {cats.numel()} categories and {weights.numel()} weights")
        if weights.numel() and int(weights.min()) < 0:
            raise ValueError(f"weights must be >= 0, got {int(weights.min())}")
        if self._scores is not None:
            self.add(torch.repeat_interleave(scores, weights), torch.repeat_interleave(cats, weights))
            return
        self._bins = None
        half = 1 << (self.bits - 1)
        nan_at = histogram_add_counts(
            scores.contiguous().numpy(), cats.contiguous().numpy(), weights.contiguous().numpy(), self._shift, half,
            *self._raw_arrays(),
        )  # fmt: skip
        _raise_rejected(nan_at, cats)

    def add_ranked(self, start: int, sorted_cats: torch.Tensor, n: int) -> None:
        """Add ``qtile`` scores ``r / (n − 1)`` (float32) of ranks ``r = start, start + 1, …`` whose categories
        are ``sorted_cats``: what :func:`qtile_values` + :meth:`add` give, fused."""
        sorted_cats = sorted_cats.reshape(-1).to(torch.uint8)
        if sorted_cats.numel() and int(sorted_cats.max()) > FORGET:
            raise ValueError(_BAD_CATEGORY.format(int(sorted_cats.max())))
        if self._scores is not None:
            stop = start + sorted_cats.numel()
            self.add(qtile_values(start, stop, n), sorted_cats)
            return
        self._bins = None
        half = 1 << (self.bits - 1)
        qtile_histogram_add(start, sorted_cats.contiguous().numpy(), n, self._shift, half, *self._raw_arrays())

    def add_ranked_ties(
        self,
        sorted_cats: np.ndarray | torch.Tensor,
        ties: np.ndarray | torch.Tensor,
        lo: int = 0,
        hi: int | None = None,
    ) -> None:
        """Add ``qtile`` scores with average ranks of ranks ``[lo, hi)`` (default: all) of a tensor of
        ``n = sorted_cats.size`` scalars: ``sorted_cats`` are its categories in ascending score order and ``ties``
        its tie flags (:func:`~lacuna_metrics.kernels.rank_categories_ties`), both for the whole tensor. Each
        scalar's value is :func:`~lacuna_metrics.kernels.qtile_ties_values`: the members of a run of equal scores
        share its average rank; what that function's values + :meth:`add` give. Add a tensor in one call: a run
        split between calls is rescanned by each."""
        cats = sorted_cats.numpy() if isinstance(sorted_cats, torch.Tensor) else np.asarray(sorted_cats)
        flags = ties.numpy() if isinstance(ties, torch.Tensor) else np.asarray(ties)
        cats, flags = cats.reshape(-1), flags.reshape(-1)
        if cats.dtype != np.uint8 or flags.dtype != np.uint8 or cats.size != flags.size:
            raise ValueError(f"need uint8 categories and tie flags of one size, got {cats.dtype}[{cats.size}] and "
                             f"{flags.dtype}[{flags.size}]")  # fmt: skip
        hi = cats.size if hi is None else hi
        if not 0 <= lo <= hi <= cats.size:
            raise ValueError(f"ranks [{lo}, {hi}) outside a tensor of {cats.size}")
        if hi > lo and int(cats[lo:hi].max()) > FORGET:
            raise ValueError(_BAD_CATEGORY.format(int(cats[lo:hi].max())))
        if self._scores is not None and self._buffered + (hi - lo) > self.exact_limit:
            self._spill()  # as add() would after buffering them
        if self._scores is not None:
            values = torch.from_numpy(qtile_ties_values(flags, lo, hi))
            self.add(values, torch.from_numpy(np.ascontiguousarray(cats[lo:hi])))
            return
        self._bins = None
        half = 1 << (self.bits - 1)
        qtile_ties_histogram_add(
            lo, hi, np.ascontiguousarray(cats), np.ascontiguousarray(flags), self._shift, half, *self._raw_arrays()
        )

    def reset(self) -> None:
        """Forget every score seen, back to exact (buffering) mode; a spilled histogram's memory is cleared
        bin by occupied bin and kept for the next spill, so one accumulator serves many groups cheaply."""
        if self._counts is not None:
            arrays = self._arrays()  # the side table is folded, so left empty
            clear_bins(occupied_bins(arrays[0]), *arrays, 1 << self._shift)
            self._spare = (self._counts, self._off_edge, self._low_min, self._low_max, self._table)
        self._counts = self._off_edge = self._low_min = self._low_max = self._table = None
        self._scores, self._cats, self._buffered, self._bins = [], [], 0, None

    def merge_into(self, other: StreamingAUC) -> None:
        """Add everything this accumulator saw to ``other`` (same ``bits`` and ``exact_limit``).

        Why: a (layer, component) group's accumulator is merged into the universe's instead of histogramming
        every scalar twice. Only occupied bins are touched, so a merge costs far less than the group's pass.
        """
        if (other.bits, other.exact_limit) != (self.bits, self.exact_limit):
            raise ValueError(f"cannot merge bits={self.bits} into bits={other.bits} (or different exact limits)")
        if self._scores is not None:  # still exact: the other one sees the same chunks
            for scores, cats in zip(self._scores, self._cats, strict=True):
                other.add(scores, cats)
            return
        if other._scores is not None:  # this one spilled, so together they exceed the exact limit
            other._spill()
        other._bins = None
        mine = self._arrays()
        merge_bins(occupied_bins(mine[0]), *mine, *other._arrays())

    def _binned(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-bin category counts ``[bins, 3]`` in ascending score order, and per bin the counts of keys
        that may differ from the others (zero where the bin holds a single value)."""
        if self._bins is None:
            self._bins = self._compute_bins()
        return self._bins

    def _compute_bins(self) -> tuple[np.ndarray, np.ndarray]:
        if self._counts is not None:
            self._fold()
            assert self._low_min is not None and self._low_max is not None and self._off_edge is not None
            occupied = occupied_bins(self._counts.numpy())  # ascending bin indices, usually few
            counts = self._counts.view(-1, _NCAT).numpy()[occupied]
            off = self._off_edge.view(-1, _NCAT).numpy()[occupied]
            off_total = off.sum(axis=1)
            on_edge = counts.sum(axis=1) - off_total
            # a bin holds several values iff it has off-edge keys and either on-edge keys or unequal off-edge keys
            unequal = self._low_min.numpy()[occupied] != self._low_max.numpy()[occupied]
            mixed = (off_total > 0) & ((on_edge > 0) | unequal)
            return counts, off * mixed[:, None]
        assert self._scores is not None
        return _distinct_value_bins(self._scores, self._cats)

    def _target_bins(self, target: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positives, negatives and uncertain pairs per bin for ``target``.

        Within a bin, keys on the bin's lower edge are all equal (a tie, counted exactly); only pairs
        with at least one off-edge key may be misordered: ``pos·neg − pos_edge·neg_edge`` of them.
        """
        pos_cats, neg_cats = TARGETS[target]
        counts, off = self._binned()
        pos = counts[:, list(pos_cats)].sum(axis=1)
        neg = counts[:, list(neg_cats)].sum(axis=1)
        pos_off = off[:, list(pos_cats)].sum(axis=1)
        neg_off = off[:, list(neg_cats)].sum(axis=1)
        has_off = (pos_off + neg_off) > 0
        uncertain = np.where(
            has_off, pos.astype(np.float64) * neg - (pos - pos_off).astype(np.float64) * (neg - neg_off), 0.0
        )
        keep = (pos + neg) > 0
        return pos[keep], neg[keep], uncertain[keep]

    def result(self, target: str) -> AUCResult:
        """AUC for ``target`` (None when a class is empty) and its error bound (0 = exact)."""
        pos, neg, uncertain = self._target_bins(target)
        return binned_auc(pos, neg, uncertain)

    def precision_at(self, target: str, fractions: tuple[float, ...]) -> dict[str, float | None]:
        """Share of positives among the top ``fraction`` of the target's scalars (ties split pro rata)."""
        pos, neg, _ = self._target_bins(target)
        return binned_precision(pos, neg, fractions)

    def roc_curve(self, target: str, max_points: int = 256) -> dict[str, list[float]]:
        """ROC points (FPR, TPR) from the top score down, thinned to about ``max_points``."""
        pos, neg, _ = self._target_bins(target)
        return binned_roc(pos, neg, max_points)


def _distinct_value_bins(scores: list[torch.Tensor], cats: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """One bin per distinct score: sort (key, category) pairs packed in a uint64 and count runs."""
    if not scores:
        return np.zeros((0, _NCAT), dtype=np.int64), np.zeros((0, _NCAT), dtype=np.int64)
    packed = np.concatenate(
        [
            (float_keys(s).numpy().astype(np.uint64) << np.uint64(2)) | c.numpy().astype(np.uint64)
            for s, c in zip(scores, cats, strict=True)
        ]
    )
    packed.sort()
    keys = packed >> np.uint64(2)
    new_run = np.empty(keys.size, dtype=bool)
    new_run[0] = True
    np.not_equal(keys[1:], keys[:-1], out=new_run[1:])
    run = np.cumsum(new_run) - 1
    n_runs = int(run[-1]) + 1
    counts = np.bincount(run * _NCAT + (packed & np.uint64(3)).astype(np.int64), minlength=n_runs * _NCAT)
    return counts.reshape(-1, _NCAT), np.zeros((n_runs, _NCAT), dtype=np.int64)


def binned_auc(pos: np.ndarray, neg: np.ndarray, uncertain: np.ndarray | None = None) -> AUCResult:
    """AUC from per-bin positive/negative counts in ascending score order; ties inside a bin count ½.

    ``uncertain`` counts, per bin, the (positive, negative) pairs that may hold distinct values; each
    is off by at most ½ from the tie rule, so ``½ Σ uncertain / (P·N)`` bounds the error rigorously.
    """
    pos = np.asarray(pos, dtype=np.float64)
    neg = np.asarray(neg, dtype=np.float64)
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return AUCResult(None, 0.0, int(n_pos), int(n_neg))
    neg_below = np.cumsum(neg) - neg
    wins = float((pos * (neg_below + 0.5 * neg)).sum())  # not np.dot: BLAS threads would wake up and spin
    bound = 0.0 if uncertain is None else float(0.5 * np.sum(uncertain) / (n_pos * n_neg))
    return AUCResult(min(1.0, max(0.0, wins / (n_pos * n_neg))), bound, int(n_pos), int(n_neg))


def binned_precision(pos: np.ndarray, neg: np.ndarray, fractions: tuple[float, ...]) -> dict[str, float | None]:
    """Precision among the top-k scalars, k = ⌈fraction·n⌉; the boundary bin contributes pro rata."""
    pos = np.asarray(pos, dtype=np.float64)[::-1]
    total = pos + np.asarray(neg, dtype=np.float64)[::-1]
    n = float(total.sum())
    cum_total, cum_pos = np.cumsum(total), np.cumsum(pos)
    out: dict[str, float | None] = {}
    for fraction in fractions:
        label = f"{fraction * 100:g}%"
        k = math.ceil(round(fraction * n, 9))  # round first: 0.07 * 100 is 7.000000000000001
        if k == 0:
            out[label] = None
            continue
        b = int(np.searchsorted(cum_total, k))  # first bin reaching k scalars
        above_total = cum_total[b] - total[b]
        above_pos = cum_pos[b] - pos[b]
        out[label] = float((above_pos + (k - above_total) * pos[b] / total[b]) / k)
    return out


def binned_roc(pos: np.ndarray, neg: np.ndarray, max_points: int = 256) -> dict[str, list[float]]:
    """ROC curve points from per-bin counts (ascending score order), starting at (0, 0)."""
    pos = np.asarray(pos, dtype=np.float64)[::-1]
    neg = np.asarray(neg, dtype=np.float64)[::-1]
    if pos.sum() == 0 or neg.sum() == 0:
        return {"fpr": [], "tpr": []}
    tpr = np.concatenate(([0.0], np.cumsum(pos) / pos.sum()))
    fpr = np.concatenate(([0.0], np.cumsum(neg) / neg.sum()))
    if tpr.size > max_points:
        pick = np.unique(np.linspace(0, tpr.size - 1, max_points).round().astype(int))
        tpr, fpr = tpr[pick], fpr[pick]
    return {"fpr": [round(float(v), 6) for v in fpr], "tpr": [round(float(v), 6) for v in tpr]}
