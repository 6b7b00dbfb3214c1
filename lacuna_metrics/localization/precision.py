"""Localization precision (docs/definitions.md#localization-precision): did the unlearning update land on the scalars
that hold the facts?

Every scalar of the *universe* (masked attention/MLP tensors with both positives and negatives) is one
sample; its label comes from the ground-truth masks and its score from one of the LACUNA scoring
functions (:mod:`lacuna_metrics.localization.families`) of the before/after weights (plus an optional reference ``base`` and an
unmasked control pair). Scores are streamed tensor block by tensor block into
:class:`~lacuna_metrics.localization.auc.StreamingAUC` (:mod:`lacuna_metrics.localization.sinks`), so memory is bounded by the largest
(layer, component) group, never the model.

:class:`Localization` drives the one walk over the pair (:mod:`lacuna_metrics.weights.pair_walk`) group by group. Each
(layer, component) group is read once and scored while it is read, except the scores normalised by a group
statistic (:mod:`lacuna_metrics.localization.group_stats`): the group keeps δ (and the contrast) in memory, and one worker
scores those from the buffers while the others read the next group. Groups larger than
``LocalizationConfig.group_buffer_scalars`` are read twice instead (the second time from the page cache).
``qtile`` and ``crossfield`` need the whole tensor's ranks, so they sort one tensor at a time (a radix sort). Tied
scores share their average rank (``LocalizationConfig.qtile_ties = "average"``, the default): ranking ties in index
order, as the release code's stable argsort does (``"ordinal"``), turns an unchanged or bf16-quantized update into
signal wherever the masks have structure (docs/scoring.md, "Ties in qtile").

One compiled pass per block (:func:`~lacuna_metrics.kernels.pair_pass`) gives categories, |δ|, |θ_before| and the
group sums; the per-layer score is histogrammed once per group and then merged into the universe's histogram. The
composite is fitted on a seeded subsample after the walk (:mod:`lacuna_metrics.localization.composite`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lacuna_metrics.localization.auc import qtile_values
from lacuna_metrics.localization.composite import composite_model, fit_composite, out_of_fold_proba, warm_composite
from lacuna_metrics.localization.families import (
    BASELINES,
    COMPOSITE_FEATURES,
    ELEMENTWISE,
    FAMILIES,
    GROUP_NORMALISED,
    QTILE_TIES,
    SCORES,
    categories,
    group_normalised,
    required_inputs,
    score_block,
    within_tensor_qtile,
    within_tensor_quantile,
)
from lacuna_metrics.localization.group_stats import (
    GroupScoring,
    GroupStats,
    TensorState,
    control_sums,
    fold_group,
    score_buffered,
)
from lacuna_metrics.localization.json_section import per_layer_rows, score_tables, universe_record
from lacuna_metrics.localization.nulls import ROUNDED_DTYPES, NullSample, NullSampler
from lacuna_metrics.localization.sinks import ScoreSinks
from lacuna_metrics.localization.universe import Universe
from lacuna_metrics.masks import MaskError, MaskReader
from lacuna_metrics.weights.checkpoints import Checkpoint, release_memory
from lacuna_metrics.weights.pair_walk import DEFAULT_THREADS, Block, PairHook, PairWalk

__all__ = [
    "BASELINES",
    "COMPOSITE_FEATURES",
    "GROUP_NORMALISED",
    "QTILE_TIES",
    "SCORES",
    "Localization",
    "LocalizationConfig",
    "categories",
    "composite_model",
    "group_normalised",
    "out_of_fold_proba",
    "qtile_values",
    "required_inputs",
    "score_block",
    "warm_composite",
    "within_tensor_qtile",
    "within_tensor_quantile",
]


@dataclass
class LocalizationConfig:
    """Knobs of the localization scorer; defaults follow docs/definitions.md#localization-precision where it gives
    one."""

    scores: tuple[str, ...] | None = None  # None: every applicable score (and composite)
    composite: bool = True
    bins_bits: int = 20  # histogram resolution once more than exact_limit scalars were seen
    exact_limit: int = 1 << 22
    precision_fractions: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1)
    composite_samples: int = 2_000_000
    composite_folds: int = 5
    seed: int = 42
    block_elems: int = 1 << 20  # scalars per read block: larger blocks fragment the heap (peak RSS)
    threads: int = DEFAULT_THREADS  # worker threads, each scoring whole blocks
    # groups up to this many scalars keep δ (and the contrast) in memory for the scores normalised by a group
    # statistic instead of re-reading the group (5-9 bytes per scalar: 7B groups fit, 70B ones are re-read)
    group_buffer_scalars: int = 1 << 28
    # tied scores in qtile/crossfield: "average" ranks (ties stay ties, so they count one half in the AUC) or
    # "ordinal" (index order, the release code's stable argsort: comparable with the paper, but it turns ties into
    # signal wherever the masks have structure); docs/scoring.md, "Ties in qtile"
    qtile_ties: str = "average"

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.qtile_ties not in QTILE_TIES:
            raise ValueError(f"qtile_ties must be one of {QTILE_TIES}, got {self.qtile_ties!r}")

    eps: float = 1e-10
    roc_points: int = 128


#: Per-block sums of a group's first pass, by block number: (tensor, pair_pass sums, control_sums).
_Collected = dict[int, tuple[str, np.ndarray, list[float]]]


class Localization:
    """Score one before/after pair against ground-truth masks; see the module docstring.

    ``crossfield`` lists the after-checkpoints of the same method on each field (LACUNA: four). ``walk`` is the
    walk over ``before``/``after`` to drive (default: a new one), so that other consumers' hooks share its reads;
    ``run(on_pair)`` adds ``on_pair(name, before_block, after_block)`` to its hooks (see
    :class:`~lacuna_metrics.weights.pair_walk.PairWalk`: one block at a time in file order, reused buffers).
    """

    def __init__(
        self,
        before: Checkpoint,
        after: Checkpoint,
        masks: MaskReader,
        *,
        base: Checkpoint | None = None,
        control: tuple[Checkpoint, Checkpoint] | None = None,
        crossfield: Sequence[Checkpoint] = (),
        config: LocalizationConfig | None = None,
        walk: PairWalk | None = None,
        null_samples: int = 0,
    ) -> None:
        self.config = cfg = config or LocalizationConfig()
        self.before, self.after, self.masks, self.base, self.control = before, after, masks, base, control
        self.crossfield = list(crossfield)
        self.walk = walk or PairWalk(before, after, block_elems=cfg.block_elems, threads=cfg.threads)
        available = {"base": base is not None, "control": control is not None, "crossfield": len(crossfield) >= 2}
        self._available = available
        chosen = cfg.scores
        unknown = [s for s in chosen or () if s not in (*SCORES, "composite")]
        if unknown:
            raise ValueError(f"unknown scores {unknown}; choose from {[*SCORES, 'composite']}")
        requested = SCORES if chosen is None else tuple(s for s in chosen if s != "composite")
        self._want_composite = cfg.composite and (chosen is None or "composite" in chosen)
        self.not_applicable = {
            s: why for s, why in required_inputs((*requested, *BASELINES)).items() if not available[FAMILIES[s].needs]
        }
        self.scores = [s for s in requested if s not in self.not_applicable]
        self.baselines = [b for b in BASELINES if b not in self.not_applicable]
        self._space = Universe(
            before, after, masks, base=base, control=control, crossfield=crossfield, block_elems=cfg.block_elems
        )
        self.candidates, self._members = self._space.candidates, self._space.members
        self.per_layer_score = "qtile" if "qtile" in self.scores else "raw"
        self._sinks = ScoreSinks((*self.scores, *self.baselines), self.per_layer_score, cfg.bins_bits, cfg.exact_limit)
        self._pool: Any = None  # the walk's worker pool, during run()
        self._state_lock = threading.Lock()  # blocks_left of the tensors being scored
        self.timings: dict[str, float] = {}  # wall seconds of the walk and of the composite, set by run()
        self._group_auc: dict[tuple[int, str], dict[str, Any]] = {}  # per-group AUCs, kept as numbers
        self._group_stats: dict[tuple[int, str], GroupStats] = {}
        self._group_tensors: dict[tuple[int, str], list[str]] = {}
        self._universe: list[str] = []
        self._control_mean: dict[str, float] = {}  # mean control δ′ per tensor of the current group
        self._reread_groups = 0  # groups too large to buffer, read twice
        self._buffered_task: Future[None] | None = None  # the last buffered group's scoring (score_buffered)
        self._warmed: Future[None] | None = None  # warm_composite, run during the walk
        self._features: list[np.ndarray] = []
        self._feature_cats: list[np.ndarray] = []
        self._rng = np.random.default_rng(cfg.seed)
        total = sum(self.masks.numel(n) for n in self._members)
        self._sample_fraction = min(1.0, cfg.composite_samples / max(1, total))
        for acc in self._sinks.acc.values():
            acc.expect(total)
        self._null_sampler = (
            NullSampler(
                [n for n in before.names if n in self._members],  # file order: the draws' order
                {n: self.masks.numel(n) for n in self._members},
                samples=null_samples,
                seed=cfg.seed,
                rounding={n: d if (d := after.info(n).dtype) in ROUNDED_DTYPES else None for n in self._members},
                base=base is not None,
                control=control is not None,
            )
            if null_samples
            else None
        )

    # -- the walk -----------------------------------------------------------------------------------

    def run(self, on_pair: PairHook | None = None, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Stream all tensors; return the localization section of the score JSON."""
        if on_pair is not None:
            self.walk.add_hook(on_pair)
        if progress is not None:
            self.walk.add_progress(progress)
        with self.walk.session() as self._pool:
            started = time.perf_counter()
            if self.composite_features():  # sklearn's imports and first fit (~1.5 s) overlap with the walk's reads
                self._warmed = self._pool.submit(warm_composite)
            with self.walk.walking(torch_threads=1):  # torch's idle OpenMP workers would spin
                self._walk()
            self.timings["walk_seconds"] = round(time.perf_counter() - started, 3)
            return self._results()

    def _walk(self) -> None:
        plan = self.walk.plan
        for key, names in self._space.units(self.one_pass):
            if key is None:
                self._pass(plan(names), universe=False, collect=None, group=None)
                continue
            members = [n for n in names if n in self._members]
            per_block: _Collected = {}
            scoring: GroupScoring | None = None
            fits = sum(self.masks.numel(n) for n in members) <= self.config.group_buffer_scalars
            buffered = not self.one_pass and fits  # the group-normalised scores from buffers after the read
            if self.one_pass or buffered:  # score while reading
                group = (key, members)
                scoring = self._pass(plan(names), universe=True, collect=per_block, group=group, buffered=buffered)
                self._finish_group(key, names, members, per_block)
                if buffered:  # one worker scores them while the others read the next group
                    self._wait_buffered()  # at most one group's buffers waiting: bounds the memory
                    self._buffered_task = self._pool.submit(self._score_buffered, scoring, dict(self._control_mean))
            else:
                self._pass(plan(names), universe=True, collect=per_block, group=None)
                self._finish_group(key, names, members, per_block)
                if members:  # second pass: the group is in the page cache now
                    scoring = self._pass(plan(members), universe=True, collect=None, group=(key, members))
                    self._reread_groups += 1
            if scoring is not None:
                self._end_group(scoring)
            if "qtile" in self.scores or "crossfield" in self.scores:  # freed tensor-sized buffers fragment the heap
                release_memory()
        self._wait_buffered()

    def _score_buffered(self, scoring: GroupScoring, control_mean: dict[str, float]) -> None:
        """A buffered group's group-normalised scores (:func:`~lacuna_metrics.localization.group_stats.score_buffered`)."""
        features, step = self.composite_features(), self.config.block_elems
        stats = self._group_stats.get(scoring.key)
        score_buffered(
            scoring, stats, control_mean, scores=self.scores, features=features, step=step, sinks=self._sinks
        )

    def _wait_buffered(self) -> None:
        """Wait for the last buffered group's scores (re-raising its error)."""
        if self._buffered_task is not None:
            pending, self._buffered_task = self._buffered_task, None
            pending.result()

    @property
    def one_pass(self) -> bool:
        """True when no requested score or composite feature needs a group statistic (σ, mean control δ′)."""
        wanted = {*self.scores, *self.composite_features()}
        return not wanted & set(GROUP_NORMALISED)

    def _pass(
        self,
        blocks: list[Block],
        *,
        universe: bool,
        collect: _Collected | None,
        group: tuple[tuple[int, str], list[str]] | None,
        buffered: bool = False,
    ) -> GroupScoring | None:
        """Process ``blocks`` on the walk's workers, each block whole (read, pair pass, scores, histograms).

        ``collect`` receives every block's sums (first pass, or the only one), keyed by block number so that they
        are added in file order; ``group`` = (key, members) scores the members' blocks into the accumulators and
        returns the group's scoring state (for :meth:`_end_group`); with ``buffered`` the group-normalised scores
        are left to :func:`~lacuna_metrics.localization.group_stats.score_buffered`. The hooks run in the first pass only.
        """
        scoring = self._start_group(group[0], group[1], blocks, buffered=buffered) if group is not None else None

        def work(blk: Block, b: dict[str, torch.Tensor]) -> None:
            if collect is not None and universe:
                collect[blk.seq] = (blk.name, b["sums"], control_sums(b))
            if scoring is not None and blk.name in scoring.tensors:
                self._score_block(blk, b, scoring)

        hooks = collect is not None or not universe
        self.walk.run_blocks(
            blocks, lambda blk: self._space.read(blk, universe, self.walk.scratch()), work, hooks=hooks
        )
        return scoring

    def _finish_group(self, key: tuple[int, str], names: list[str], members: list[str], per_block: _Collected) -> None:
        """The group's statistics (:func:`~lacuna_metrics.localization.group_stats.fold_group`) and its universe tensors."""
        stats, self._control_mean = fold_group(names, members, per_block)
        if members:
            self._group_stats[key] = stats
            self._group_tensors[key] = members
            self._universe.extend(members)

    def _start_group(
        self, key: tuple[int, str], members: list[str], blocks: list[Block], *, buffered: bool = False
    ) -> GroupScoring:
        """Per-group scoring state: σ, the group accumulator, whole-tensor buffers and the composite's samples."""
        stats = None if buffered else self._group_stats.get(key)
        self._sinks.start_group(sum(self.masks.numel(n) for n in members))
        scoring = GroupScoring(
            key=key,
            sigma=stats.sigma("delta") if stats is not None else 0.0,  # two-pass mode only: one pass needs no σ
            sigma_contrast=stats.sigma("contrast") if stats is not None else 0.0,
            buffered=buffered,
        )
        need_delta = "qtile" in self.scores or buffered
        need_contrast = buffered and self.control is not None
        # whole-tensor buffers only for what is scored from them: fresh pages cost a fault each (a second of a
        # 2 GB pair's --scores raw when the categories were kept for nothing)
        need_cats = need_delta or bool(self.crossfield)
        for name in members:  # in file order: the composite's random samples do not depend on threads
            numel = self.masks.numel(name)
            full: dict[str, torch.Tensor] = {"cats": torch.empty(numel, dtype=torch.uint8)} if need_cats else {}
            if need_delta:
                full["delta"] = torch.empty(numel, dtype=torch.float32)
            if need_contrast:
                full["contrast"] = torch.empty(numel, dtype=torch.float32)
            for i in range(len(self.crossfield)):
                full[f"crossfield{i}"] = torch.empty(numel, dtype=torch.float32)
            left = sum(1 for blk in blocks if blk.name == name)
            scoring.tensors[name] = TensorState(full=full, sample=self._sample_indices(numel), blocks_left=left)
        return scoring

    def _score_block(self, blk: Block, b: dict[str, torch.Tensor], scoring: GroupScoring) -> None:
        """Scores of one member block into the accumulators (each under its lock), the tensor's buffers and the
        composite's sample; the block that completes its tensor also scores the whole tensor (qtile, crossfield)."""
        cfg, per_layer, sinks = self.config, self.per_layer_score, self._sinks
        later = GROUP_NORMALISED if scoring.buffered else ()  # scored from the buffers once σ is known
        wanted = [s for s in (*self.scores, *self.baselines) if (s in ELEMENTWISE or s in BASELINES) and s not in later]
        feature_names = self.composite_features()
        state = scoring.tensors[blk.name]
        # computed but not fed: the composite's features and the buffered contrast (for contrastln)
        extra = [f for f in (*feature_names, *(["contrast"] if "contrast" in state.full else [])) if f not in later]
        o, u, cat = b["before"].reshape(-1), b["after"].reshape(-1), b["cats"]
        control = (b["control_before"].reshape(-1), b["control_after"].reshape(-1)) if "control_before" in b else None
        scores = score_block(
            o,
            u,
            base=b["base"].reshape(-1) if "base" in b else None,
            control=control,
            sigma=scoring.sigma,
            sigma_contrast=scoring.sigma_contrast,
            control_mean=self._control_mean.get(blk.name, 0.0),
            eps=cfg.eps,
            wanted=wanted + [f for f in extra if f not in wanted],
            delta=b["delta"],
            before_abs=b["before_abs"],
        )
        feeds = [(sinks.acc[s], scores[s]) for s in wanted if s != per_layer]
        if per_layer == "raw":
            feeds.append((sinks.group, b["delta"]))
        sinks.add_all(feeds, cat)
        lo, hi = blk.lo, blk.hi
        if "cats" in state.full:
            state.full["cats"][lo:hi] = cat
        if "delta" in state.full:
            state.full["delta"][lo:hi] = b["delta"]
        if "contrast" in state.full:
            state.full["contrast"][lo:hi] = scores["contrast"]
        for i in range(len(self.crossfield)):
            state.full[f"crossfield{i}"][lo:hi] = (b[f"crossfield{i}"].reshape(-1) - o).abs()
        if self._null_sampler is not None:
            self._null_sampler.take(
                blk.name, lo, hi, o, u, cat, base=b["base"].reshape(-1) if "base" in b else None, control=control
            )
        sample = state.sample
        if feature_names and sample.size:
            picked = sample[np.searchsorted(sample, lo) : np.searchsorted(sample, hi)] - lo  # sample is sorted
            if picked.size:
                idx = torch.from_numpy(picked)
                # a group-normalised feature is a placeholder until score_buffered fills it in
                columns = [
                    scores[f][idx].double().numpy() if f in scores else np.zeros(idx.numel()) for f in feature_names
                ]
                scoring.samples[blk.seq] = (np.stack(columns, axis=1), cat[idx].numpy())
                if scoring.buffered:
                    scoring.sample_rows[blk.seq] = (blk.name, picked + lo)
        with self._state_lock:
            state.blocks_left -= 1
            last = state.blocks_left == 0
        if last and state.full:
            runs, keep = len(self.crossfield), scoring.buffered
            sinks.finish_tensor(
                state.full, ties=cfg.qtile_ties, step=cfg.block_elems, crossfield_runs=runs, keep_delta=keep
            )
            if not scoring.buffered:
                state.full = {}

    def _end_group(self, scoring: GroupScoring) -> None:
        """The group's AUCs, its accumulator merged into the universe's, its samples kept in file order."""
        for seq in sorted(scoring.samples):
            features, cats = scoring.samples[seq]
            self._features.append(features)
            self._feature_cats.append(cats)
        self._group_auc[scoring.key] = self._sinks.end_group()

    def _sample_indices(self, numel: int) -> np.ndarray:
        """The composite's subsample of one tensor: the same fraction of every tensor (seeded)."""
        if not self.composite_features():
            return np.zeros(0, dtype=np.int64)
        k = round(numel * self._sample_fraction)
        return np.sort(self._rng.choice(numel, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)

    def composite_features(self) -> list[str]:
        """The composite's features available for this run (empty when the composite is off)."""
        if not self._want_composite or self.config.composite_samples <= 0:
            return []
        return [f for f in COMPOSITE_FEATURES if self._available.get(FAMILIES[f].needs or "", True)]

    # -- results ------------------------------------------------------------------------------------

    def null_sample(self) -> NullSample | None:
        """The seeded sample collected for the null calibration (``null_samples`` > 0), after :meth:`run`."""
        return self._null_sampler.result() if self._null_sampler is not None else None

    def _results(self) -> dict[str, Any]:
        cfg = self.config
        if not self._universe:
            raise MaskError(f"{self.masks.path}: no tensor has both forget and non-forget scalars; nothing to score")
        summary = self._sinks.summary(self.scores, cfg.precision_fractions, cfg.roc_points)
        # the histograms (tens of MB each) are summarised: free them before the composite's model fits
        self._sinks = ScoreSinks(list(self._sinks.acc), self.per_layer_score, cfg.bins_bits, cfg.exact_limit)
        release_memory()
        started = time.perf_counter()
        composite = self._composite()
        self.timings["composite_seconds"] = round(time.perf_counter() - started, 3)  # fits fixed by the definition
        tables = score_tables(self.scores, self.baselines, self.not_applicable, summary, composite)
        return {
            **{k: tables[k] for k in ("auc", "auc_error_bound", "precision_at_k", "baselines", "not_applicable")},
            "composite": tables["composite"],
            "per_layer": per_layer_rows(self._group_stats, self._group_auc, self._group_tensors),
            "universe": universe_record(self._universe, self._group_stats),
            "roc": tables["roc"],
            "settings": {
                "bins_bits": cfg.bins_bits,
                "exact_limit": cfg.exact_limit,
                "eps": cfg.eps,
                "per_layer_score": self.per_layer_score,
                "qtile_ties": cfg.qtile_ties,  # how qtile, crossfield and per-layer qtile AUCs rank tied scores
                # layernorm / contrastln: σ over every tensor of the group, scored or not
                # (docs/definitions.md#localization-precision, the release)
                "sigma": "population std (ddof=0) over every tensor of the (layer, component) group",
                "crossfield_runs": len(self.crossfield),
                "passes_per_group": 1 if self.one_pass else 2,  # over each group's scalars (read, or buffers)
                "group_buffer_scalars": cfg.group_buffer_scalars,
                "reread_groups": self._reread_groups,
            },
        }

    def _composite(self) -> dict[str, Any] | None:
        """The composite (:func:`~lacuna_metrics.localization.composite.fit_composite`) on the walk's subsample."""
        names = self.composite_features()
        if not names or not self._features:
            return None
        if self._warmed is not None:
            self._warmed.result()
        cfg = self.config
        return fit_composite(
            names,
            self._features,
            self._feature_cats,
            folds=cfg.composite_folds,
            threads=cfg.threads,
            roc_points=cfg.roc_points,
            pool=self._pool,
        )
