"""Where a localization run's scores go: one :class:`~lacuna_metrics.localization.auc.StreamingAUC` per score and baseline, plus
the accumulator of one (layer, component) group's per-layer score, each under its own lock.

Worker threads of the walk (:mod:`lacuna_metrics.weights.pair_walk`) feed them concurrently; histograms are counts, so the
order of the additions never changes a number. The whole-tensor scores (``qtile``, ``crossfield``) are ranked here
once a tensor's last block is in (:meth:`ScoreSinks.finish_tensor`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from lacuna_metrics.kernels import rank_categories, rank_categories_ties
from lacuna_metrics.localization.auc import TARGETS, AUCResult, StreamingAUC
from lacuna_metrics.localization.families import crossfield_score
from lacuna_metrics.weights.checkpoints import release_memory

__all__ = ["TRIM_ABOVE_SCALARS", "ScoreSinks"]

#: Also trim right after a tensor this large is ranked (its sort buffers are hundreds of MB). Trimming is
#: not free: the next allocations fault their pages in again (~20% of a 2 GB pair's ``--scores raw`` time).
TRIM_ABOVE_SCALARS = 1 << 25

Feed = tuple[StreamingAUC, torch.Tensor]


class ScoreSinks:
    """The accumulators of ``names`` (scores and baselines) and of the per-layer score ``per_layer`` of the current
    group (:attr:`group`, merged into ``per_layer``'s accumulator by :meth:`end_group`)."""

    def __init__(self, names: Iterable[str], per_layer: str, bins_bits: int, exact_limit: int) -> None:
        self.acc = {s: StreamingAUC(bins_bits, exact_limit) for s in names}
        self.group = StreamingAUC(bins_bits, exact_limit)  # reset for every (layer, component)
        self.per_layer = per_layer
        self._locks = {id(acc): threading.Lock() for acc in (*self.acc.values(), self.group)}

    def lock(self, acc: StreamingAUC) -> AbstractContextManager[Any]:
        """The lock of ``acc`` (hold it while adding)."""
        return self._locks[id(acc)]

    def add_all(self, feeds: list[Feed], cats: torch.Tensor) -> None:
        """Add each (accumulator, scores) pair, taking first the accumulators no other worker holds."""
        todo = list(feeds)
        while todo:
            i = next((i for i, (acc, _) in enumerate(todo) if self._locks[id(acc)].acquire(blocking=False)), None)
            if i is None:  # all held by other workers: wait for the first
                i = 0
                self._locks[id(todo[0][0])].acquire()
            acc, values = todo.pop(i)
            try:
                acc.add(values, cats)
            finally:
                self._locks[id(acc)].release()

    def start_group(self, scalars: int) -> None:
        """Reset the per-layer accumulator for a group of ``scalars`` universe scalars."""
        self.group.reset()
        self.group.expect(scalars)

    def end_group(self) -> dict[str, tuple[float | None, float]]:
        """The group's per-layer AUC and error bound per target; its histogram then joins the universe's."""
        results = {t: self.group.result(t) for t in TARGETS}
        if self.per_layer in self.acc:
            self.group.merge_into(self.acc[self.per_layer])
        return {t: (r.value, r.error_bound) for t, r in results.items()}

    def finish_tensor(
        self, full: dict[str, torch.Tensor], *, ties: str, step: int, crossfield_runs: int, keep_delta: bool = False
    ) -> None:
        """Whole-tensor scores of one tensor from its buffers: qtile (and the per-group AUC on it) and crossfield,
        with ties ranked as ``ties`` says; ``full`` loses its crossfield buffers, and δ unless ``keep_delta`` (a
        buffered group still needs it)."""
        cat = full["cats"]
        n = cat.numel()
        if "qtile" in self.acc:
            delta = full["delta"] if keep_delta else full.pop("delta")
            qtile_acc = self.group if self.per_layer == "qtile" else self.acc["qtile"]
            if ties == "average":  # cats by rank and the tie flags: each run of equal δ is one value
                ranked, flags = rank_categories_ties(delta.numpy(), cat.numpy())
                with self.lock(qtile_acc):
                    qtile_acc.add_ranked_ties(ranked, flags)  # one call: a run split between calls is rescanned
                del flags
            else:
                ranked = torch.from_numpy(rank_categories(delta.numpy(), cat.numpy()))  # cats by rank
                with self.lock(qtile_acc):
                    for start in range(0, n, step):
                        qtile_acc.add_ranked(start, ranked[start : start + step], n)
            del ranked, delta
            if n >= TRIM_ABOVE_SCALARS:
                release_memory()
        if "crossfield" in self.acc:
            crossed = crossfield_score((full.pop(f"crossfield{i}") for i in range(crossfield_runs)), ties)
            with self.lock(self.acc["crossfield"]):
                for start in range(0, n, step):
                    self.acc["crossfield"].add(crossed[start : start + step], cat[start : start + step])

    def summary(
        self, scores: Sequence[str], fractions: tuple[float, ...], roc_points: int
    ) -> tuple[dict[tuple[str, str], AUCResult], dict[tuple[str, str], Any], dict[tuple[str, str], Any]]:
        """(AUC results, precision@k of ``scores``, ROC curves) per (name, target) of every accumulator."""
        results = {(s, t): acc.result(t) for s, acc in self.acc.items() for t in TARGETS}
        precisions = {(s, t): self.acc[s].precision_at(t, fractions) for s in scores for t in TARGETS}
        curves = {(s, t): acc.roc_curve(t, roc_points) for s, acc in self.acc.items() for t in TARGETS}
        return results, precisions, curves
