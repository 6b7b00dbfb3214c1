"""Localization precision (docs/definitions.md#localization-precision): did the unlearning update land on the scalars
that hold the facts?

Every scalar of the *universe* (masked attention/MLP tensors with both positives and negatives) is one
sample; its label comes from the ground-truth masks and its score from one of the LACUNA scoring
functions of the before/after weights (plus an optional reference ``base`` and an unmasked control
pair). Scores are streamed tensor block by tensor block into :class:`~lacuna_metrics.auc.StreamingAUC`,
so memory is bounded by the largest (layer, component) group, never the model.

Each (layer, component) group is read once and scored while it is read, except the scores normalised by a
group statistic (``layernorm``, ``contrastln``, ``compnorm``, also as composite features): σ of δ and of the
contrast per group and the mean control δ′ per tensor are known only after the group's last block (σ is over every
attention/MLP tensor of the group in the checkpoint pair, in the universe or not: a masked tensor without forget
scalars, an unmasked one; as in the release's first pass). The group keeps δ (and the contrast) in
memory, and one worker scores those from the buffers while the others read the next group; ``layernorm`` and
``compnorm`` are functions of δ alone, so a bf16 pair's few distinct δ values are each scored once, with their
counts. Groups larger than ``LocalizationConfig.group_buffer_scalars`` are read
twice instead (the second time from the page cache). ``qtile`` and ``crossfield`` need the whole tensor's
ranks, so they sort one tensor at a time (a radix sort). Tied scores share their average rank
(``LocalizationConfig.qtile_ties = "average"``, the default): ranking ties in index order, as the release code's
stable argsort does (``"ordinal"``), turns an unchanged or bf16-quantized update into signal wherever the masks
have structure (docs/scoring.md, "Ties in qtile").

The walk runs on worker threads (``LocalizationConfig.threads``), each reading and scoring whole blocks: one
compiled pass per block (:func:`~lacuna_metrics.kernels.pair_pass`) gives categories, |δ|, |θ_before| and the
group sums, then every score's accumulator is updated under its own lock. Hooks run in file order (a turnstile)
and sums are folded in file order, so no number depends on the thread count. The per-layer score is
histogrammed once per group and then merged into the universe's histogram.
"""

from __future__ import annotations

import gc
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lacuna_metrics.auc import FORGET, OUTSIDE, RETAIN, TARGETS, StreamingAUC, binned_roc, qtile_values, roc_auc
from lacuna_metrics.checkpoints import Checkpoint, CheckpointError, Scratch, release_memory
from lacuna_metrics.kernels import (
    TABLE_KEYS,
    bf16_value_counts,
    categorize,
    pair_pass,
    qtile_ties_values,
    rank_categories,
    rank_categories_ties,
    stable_order,
    stable_sorted_ties,
)
from lacuna_metrics.masks import MaskError, MaskReader, component, layer_index

__all__ = [
    "BASELINES",
    "COMPOSITE_FEATURES",
    "QTILE_TIES",
    "SCORES",
    "Localization",
    "LocalizationConfig",
    "qtile_values",
    "score_block",
    "within_tensor_qtile",
    "within_tensor_quantile",
]

#: Scoring functions of docs/definitions.md#localization-precision, in its order (``composite`` is fitted on top of
#: them).
SCORES: tuple[str, ...] = (
    "raw",
    "qtile",
    "layernorm",
    "compnorm",
    "signrev",
    "reversal",
    "dirreversal",
    "contrast",
    "contrastnorm",
    "contrastln",
    "eratio",
    "crossfield",
)
#: Method-free magnitude detectors on the same universe: how much a score needs no unlearning at all.
BASELINES: tuple[str, ...] = ("before_magnitude", "injection_magnitude")
#: The composite's ten features (docs/definitions.md#localization-precision), those available for the run are used.
COMPOSITE_FEATURES: tuple[str, ...] = (
    "raw",
    "layernorm",
    "signrev",
    "reversal",
    "dirreversal",
    "contrast",
    "contrastnorm",
    "contrastln",
    "eratio",
    "compnorm",
)
_NEEDS = {
    "compnorm": "control",
    "contrast": "control",
    "contrastnorm": "control",
    "contrastln": "control",
    "eratio": "control",
    "signrev": "base",
    "reversal": "base",
    "dirreversal": "base",
    "crossfield": "crossfield",
    "injection_magnitude": "base",
}
_WHY = {
    "control": "needs the unmasked control pair (--control-before/--control-after)",
    "base": "needs a reference checkpoint (--base)",
    "crossfield": "needs the per-field runs of the same method (--crossfield, at least two)",
}
_ELEMENTWISE = tuple(s for s in SCORES if s not in ("qtile", "crossfield"))
#: Scores normalised by a statistic of their whole (layer, component) group or tensor: known after its last block.
GROUP_NORMALISED: tuple[str, ...] = ("layernorm", "compnorm", "contrastln")
#: How ``qtile`` (and ``crossfield``, per-layer AUCs) rank tied scores: ``"average"`` (mid-ranks, the default) or
#: ``"ordinal"`` (index order: the release code's stable argsort, for comparison with the paper); docs/scoring.md.
QTILE_TIES: tuple[str, ...] = ("average", "ordinal")
_PAIR = ("before", "after")


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
    threads: int = max(1, min(4, os.cpu_count() or 1))  # worker threads, each scoring whole blocks
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


@dataclass
class _GroupStats:
    """First-pass sums of one (layer, component) group: the σ sums over *every* tensor of the group
    (docs/definitions.md#localization-precision and the release: all attention/MLP tensors of the layer, in the universe
    or not), the scalar count and the update energy over its universe tensors."""

    n: int = 0  # universe scalars
    n_sigma: int = 0  # every scalar of the group: the σs' population
    delta: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σδ, Σδ² (every tensor of the group)
    contrast: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σc, Σc² (every tensor of the group)
    energy: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # ΣΔ² outside / retain / forget (universe)

    def sigma(self, which: str) -> float:
        s, s2 = getattr(self, which)
        if self.n_sigma == 0:
            return 0.0
        var = max(0.0, s2 / self.n_sigma - (s / self.n_sigma) ** 2)  # population std (ddof=0)
        return math.sqrt(var)


def within_tensor_quantile(delta: torch.Tensor) -> torch.Tensor:
    """The stable order of a tensor's scores: ``order[r]`` is the flat index of the scalar of ordinal rank ``r``.

    A stable argsort (ties keep index order), a radix sort of the scores' order-preserving keys
    (:func:`lacuna_metrics.kernels.stable_order`): the release code's ranks, whose ``r / (n − 1)`` is
    ``qtile_ties="ordinal"`` (see :func:`qtile_values`). The default qtile gives ties their average rank instead
    (:func:`within_tensor_qtile`).
    """
    flat = _flat_scores(delta)
    return torch.from_numpy(stable_order(flat.numpy()).astype(np.int64))


def within_tensor_qtile(scores: torch.Tensor, ties: str = "average") -> torch.Tensor:
    """The ``qtile`` (docs/definitions.md#localization-precision) of every scalar of a tensor, float32 in flat
    (row-major) index order.

    ``ties="average"``: ``qtile_i = (average 0-based rank of scalar i's group of equal scores) / (n − 1)``
    (−0 and +0 are equal), so equal scores get equal qtiles; ``"ordinal"``: ``rank / (n − 1)`` with ties ranked
    in index order (the release code's stable argsort). docs/scoring.md explains the difference.
    """
    if ties not in QTILE_TIES:
        raise ValueError(f"ties must be one of {QTILE_TIES}, got {ties!r}")
    flat = _flat_scores(scores)
    n = flat.numel()
    out = torch.empty(n, dtype=torch.float32)
    if ties == "average":
        order, flags = stable_sorted_ties(flat.numpy(), np.arange(n, dtype=np.uint32))
        out[torch.from_numpy(order.astype(np.int64))] = torch.from_numpy(qtile_ties_values(flags, 0, n))
    else:
        out[torch.from_numpy(stable_order(flat.numpy()).astype(np.int64))] = qtile_values(0, n, n)
    return out


def _flat_scores(scores: torch.Tensor) -> torch.Tensor:
    flat = scores.reshape(-1).to(torch.float32).contiguous()
    if flat.numel() >= 1 << 32:
        raise ValueError(f"tensor of {flat.numel()} scalars is too large for the 32-bit radix sort")
    return flat


def score_block(
    o: torch.Tensor,
    u: torch.Tensor,
    *,
    base: torch.Tensor | None = None,
    control: tuple[torch.Tensor, torch.Tensor] | None = None,
    sigma: float = 0.0,
    sigma_contrast: float = 0.0,
    control_mean: float = 0.0,
    eps: float = 1e-10,
    wanted: Sequence[str] = (*_ELEMENTWISE, *BASELINES),
    delta: torch.Tensor | None = None,
    before_abs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Elementwise scores (docs/definitions.md#localization-precision) of one block (float32); absent inputs skip their
    scores.

    ``sigma`` / ``sigma_contrast`` are the (layer, component) stds of δ and of the contrast, and
    ``control_mean`` the tensor's mean control δ′. A zero σ gives score 0 (the group did not move);
    a zero control mean makes ``compnorm`` fall back to δ, as the reference code does. ``delta`` (|u − o|)
    and ``before_abs`` (|o|) may be passed in when already computed (:func:`~lacuna_metrics.kernels.pair_pass`).
    """
    out: dict[str, torch.Tensor] = {}
    want = set(wanted)
    d = u - o if base is not None else None  # the signed δ is only needed by the base scores
    if delta is None:
        delta = d.abs() if d is not None else (u - o).abs_()
    if "raw" in want:
        out["raw"] = delta
    if "before_magnitude" in want:
        out["before_magnitude"] = o.abs() if before_abs is None else before_abs
    contrast = None
    if control is not None:
        dc = (control[1] - control[0]).abs()
        contrast = delta - dc
        if "contrast" in want:
            out["contrast"] = contrast
        if "contrastnorm" in want:
            denom = delta + dc
            out["contrastnorm"] = torch.where(denom > 1e-12, contrast / denom.clamp_min(1e-12), torch.zeros_like(denom))
        if "eratio" in want:
            out["eratio"] = delta / (dc + eps)
    normalised = want if control is not None else want - {"compnorm"}  # compnorm needs the control run
    out.update(group_normalised(delta, contrast, sigma, sigma_contrast, control_mean, wanted=normalised))
    if base is not None:
        assert d is not None
        inj = o - base
        abs_inj = inj.abs()
        if "signrev" in want:
            out["signrev"] = -(inj * d)
        if "reversal" in want:
            out["reversal"] = (abs_inj - (d + inj).abs()) / (abs_inj + eps)
        if "dirreversal" in want:
            out["dirreversal"] = -d * torch.sign(inj) / (abs_inj + eps)
        if "injection_magnitude" in want:
            out["injection_magnitude"] = abs_inj
    return out


def group_normalised(
    delta: torch.Tensor,
    contrast: torch.Tensor | None,
    sigma: float,
    sigma_contrast: float,
    control_mean: float,
    *,
    wanted: Iterable[str],
) -> dict[str, torch.Tensor]:
    """The scores of :data:`GROUP_NORMALISED` among ``wanted``: ``layernorm`` = δ/σ, ``compnorm`` = δ/mean δ′ of
    the tensor, ``contrastln`` = contrast/σ_c (when ``contrast`` is given). One definition for the block-by-block
    scoring and for the scoring of a group's buffers (or of their distinct δ values) once its statistics are known."""
    out: dict[str, torch.Tensor] = {}
    want = set(wanted)
    if "layernorm" in want:
        out["layernorm"] = delta / sigma if sigma > 0 else torch.zeros_like(delta)
    if "compnorm" in want:
        out["compnorm"] = delta / control_mean if control_mean > 0 else delta
    if "contrastln" in want and contrast is not None:
        out["contrastln"] = contrast / sigma_contrast if sigma_contrast > 0 else torch.zeros_like(delta)
    return out


def _group_key(name: str) -> tuple[int, str]:
    """The (layer, component) group of an attention/MLP tensor (``layernorm``'s σ is per group)."""
    return (layer_index(name) or 0, str(component(name)))


def categories(packed: torch.Tensor, forget_bits: int, retain_bits: int) -> torch.Tensor:
    """uint8 category per scalar: FORGET if any forget bit, else RETAIN if any retain bit, else OUTSIDE."""
    flat = packed.reshape(-1).contiguous()
    if flat.dtype not in (torch.uint8, torch.int32):
        flat = flat.to(torch.int32)
    out = torch.empty(flat.numel(), dtype=torch.uint8)
    categorize(flat.numpy(), np.int32(forget_bits), np.int32(retain_bits), out.numpy())
    return out


#: Also trim right after a tensor this large is ranked (its sort buffers are hundreds of MB). Trimming is
#: not free: the next allocations fault their pages in again (~20% of a 2 GB pair's ``--scores raw`` time).
TRIM_ABOVE_SCALARS = 1 << 25


def _trim_after(numel: int) -> None:
    if numel >= TRIM_ABOVE_SCALARS:
        release_memory()


PairHook = Callable[[str, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class _Block:
    """Rows ``[start, stop)`` of tensor ``name`` (flat scalars ``[lo, hi)``), the ``seq``-th block of the walk."""

    seq: int
    name: str
    start: int
    stop: int
    lo: int
    hi: int


@dataclass
class _TensorState:
    """A member tensor being scored: whole-tensor buffers (categories, qtile/crossfield inputs), its composite
    sample, and how many of its blocks are still to be scored."""

    full: dict[str, torch.Tensor]
    sample: np.ndarray
    blocks_left: int


@dataclass
class _GroupScoring:
    """What scoring one (layer, component) group needs: its σs, its tensors, and the samples by block number.

    ``buffered``: the group is scored while it is read, except the :data:`GROUP_NORMALISED` scores, whose σ and
    means are known only after its last block; its tensors keep δ (and the contrast) for them, and the
    composite's samples keep their rows so that those features are filled in then (:meth:`Localization._score_buffered`)."""

    key: tuple[int, str]
    sigma: float
    sigma_contrast: float
    buffered: bool = False  # the group-normalised scores wait for the group's statistics (kept buffers)
    tensors: dict[str, _TensorState] = field(default_factory=dict)
    samples: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    sample_rows: dict[int, tuple[str, np.ndarray]] = field(default_factory=dict)  # buffered: block -> rows


class _Turnstile:
    """Lets worker threads run a step one block at a time in block order (the ``on_pair`` hooks add float sums,
    whose rounding depends on the order)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0

    @contextmanager
    def turn(self, seq: int) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._next == seq)
        try:
            yield
        finally:
            with self._cond:
                self._next = seq + 1
                self._cond.notify_all()


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``n`` (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _gc_frozen() -> Iterator[None]:
    """Keep the objects that exist before the walk (torch, sklearn, ...) out of the garbage collector's sweeps
    during it: the walk allocates small objects per block, whose collections otherwise re-scan them all."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Localization:
    """Score one before/after pair against ground-truth masks; see the module docstring.

    ``crossfield`` lists the after-checkpoints of the same method on each field (LACUNA: four).
    ``run(on_pair)`` walks every tensor of the checkpoints once (twice for the universe) and calls
    ``on_pair(name, before_block, after_block)`` for each block, so distances and FRAG share the reads. The
    hook runs on a worker thread, one block at a time in file order; the blocks are reused buffers, valid only
    during the call (copy what must outlive it).
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
    ) -> None:
        self.config = config or LocalizationConfig()
        self.before, self.after, self.masks, self.base, self.control = before, after, masks, base, control
        self.crossfield = list(crossfield)
        available = {"base": base is not None, "control": control is not None, "crossfield": len(crossfield) >= 2}
        self._available = available
        chosen = self.config.scores
        unknown = [s for s in chosen or () if s not in (*SCORES, "composite")]
        if unknown:
            raise ValueError(f"unknown scores {unknown}; choose from {[*SCORES, 'composite']}")
        requested = SCORES if chosen is None else tuple(s for s in chosen if s != "composite")
        self._want_composite = self.config.composite and (chosen is None or "composite" in chosen)
        self.not_applicable = {
            s: _WHY[_NEEDS[s]] for s in (*requested, *BASELINES) if not available.get(_NEEDS.get(s, ""), True)
        }
        self.scores = [s for s in requested if s not in self.not_applicable]
        self.baselines = [b for b in BASELINES if b not in self.not_applicable]
        self.candidates = self._candidates()
        cfg = self.config
        self._acc = {s: StreamingAUC(cfg.bins_bits, cfg.exact_limit) for s in (*self.scores, *self.baselines)}
        self._group_acc = StreamingAUC(cfg.bins_bits, cfg.exact_limit)  # reset for every (layer, component)
        self._locks = {id(acc): threading.Lock() for acc in (*self._acc.values(), self._group_acc)}
        self._state_lock = threading.Lock()
        self._thread_state = threading.local()
        self._turnstile = _Turnstile()
        self._seq = 0  # blocks planned so far: the turnstile's order
        self._abort = False  # set when a block failed: the blocks still in flight skip their work
        self._on_pair: PairHook | None = None
        self.timings: dict[str, float] = {}  # wall seconds of the walk and of the composite, set by run()
        self._progress: Callable[[int], None] | None = None
        self._group_auc: dict[tuple[int, str], dict[str, Any]] = {}  # per-group AUCs, kept as numbers
        self._group_stats: dict[tuple[int, str], _GroupStats] = {}
        self._group_tensors: dict[tuple[int, str], list[str]] = {}
        self._universe: list[str] = []
        self._control_mean: dict[str, float] = {}  # mean control δ′ per tensor of the current group
        self._counts = [0, 0, 0]
        self._reread_groups = 0  # groups too large to buffer, read twice
        self._buffered_task: Future[None] | None = None  # the last buffered group's scoring (_score_buffered)
        self._warmed: Future[None] | None = None  # warm_composite, run during the walk
        self._features: list[np.ndarray] = []
        self._feature_cats: list[np.ndarray] = []
        self._rng = np.random.default_rng(cfg.seed)
        self.per_layer_score = "qtile" if "qtile" in self.scores else "raw"
        self._members = self._find_universe()
        total = sum(self.masks.numel(n) for n in self._members)
        self._sample_fraction = min(1.0, cfg.composite_samples / max(1, total))
        for acc in self._acc.values():
            acc.expect(total)

    # -- planning -----------------------------------------------------------------------------------

    def _candidates(self) -> set[str]:
        """Masked attention/MLP tensors (no norms, embeddings, lm_head), checked against the checkpoint."""
        have = set(self.before.names)
        names = [n for n in self.masks.names if component(n) is not None]
        missing = [n for n in names if n not in have]
        if missing:
            raise CheckpointError(
                f"{self.masks.path} masks {len(missing)} tensors missing from {self.before.path}: {missing[:8]}"
            )
        for n in names:
            self.masks.check_shape(n, self.before.shape(n), str(self.before.path))
        if not names:
            raise MaskError(f"{self.masks.path}: no masked attention/MLP tensors in {self.before.path}")
        return set(names)

    def _find_universe(self) -> set[str]:
        """Candidates with at least one forget scalar and one other scalar (docs/definitions.md#localization-precision),
        from the masks alone.

        Known before scoring, so the composite's sampling fraction is exact (reads each mask until decided).
        """
        members = set()
        for name in self.candidates:
            shape = self.before.shape(name)
            forget = other = 0
            for start, stop in self.before.iter_blocks(name, self.config.block_elems):
                packed = self.masks.read(name, shape, start, stop)
                hits = int(((packed & self.masks.forget_bits) != 0).sum())
                forget, other = forget + hits, other + packed.numel() - hits
                if forget and other:  # usually decided by the first block
                    members.add(name)
                    break
        if not members:
            raise MaskError(f"{self.masks.path}: no tensor has both forget and non-forget scalars; nothing to score")
        return members

    def _units(self) -> list[tuple[tuple[int, str] | None, list[str]]]:
        """Tensors in file order, masked ones grouped by (layer, component); when a score needs σ, an unmasked
        attention/MLP tensor joins its (layer, component) group if the group has a masked one (σ is over every
        tensor of the group)."""
        units: list[tuple[tuple[int, str] | None, list[str]]] = []
        index: dict[tuple[int, str], int] = {}
        keys = set() if self.one_pass else {_group_key(n) for n in self.candidates}
        for name in self.before.names:
            if self.before.is_alias(name):
                continue
            if name in self.candidates or (component(name) is not None and _group_key(name) in keys):
                key = _group_key(name)
                if key not in index:
                    index[key] = len(units)
                    units.append((key, []))
                units[index[key]][1].append(name)
            else:
                units.append((None, [name]))
        return units

    # -- reading ------------------------------------------------------------------------------------

    def _sources(self, universe: bool) -> dict[str, Checkpoint]:
        out = {"before": self.before, "after": self.after}
        if universe:
            if self.base is not None:
                out["base"] = self.base
            if self.control is not None:
                out["control_before"], out["control_after"] = self.control
            for i, ckpt in enumerate(self.crossfield):
                out[f"crossfield{i}"] = ckpt
        return out

    def _plan(self, names: Sequence[str]) -> list[_Block]:
        """The blocks of ``names`` in file order, numbered for the turnstile."""
        blocks = []
        for name in names:
            shape = self.before.shape(name)
            row = math.prod(shape[1:]) if len(shape) > 1 else 1
            for start, stop in self.before.iter_blocks(name, self.config.block_elems):
                blocks.append(_Block(self._seq, name, start, stop, start * row, stop * row))
                self._seq += 1
        return blocks

    def _read(self, blk: _Block, universe: bool) -> dict[str, torch.Tensor]:
        """Read one block of every source; in the universe also its mask and :meth:`_pair_pass`'s outputs.

        An unmasked tensor of a group (read for the group's σs only) gets an all-zero mask and no reference or
        crossfield reads: it needs δ and the contrast, nothing else."""
        scratch = self._scratch()
        masked = blk.name in self.candidates
        sources = self._sources(universe)
        if universe and not masked:
            sources = {k: v for k, v in sources.items() if k in ("before", "after", "control_before", "control_after")}
        b = {
            # in the universe the pair's NaN/inf check is part of the pair pass
            label: ck.read(
                blk.name, blk.start, blk.stop, check_finite=not universe or label not in _PAIR, scratch=scratch
            )
            for label, ck in sources.items()
        }
        if universe:
            if masked:
                b["mask"] = self.masks.read(blk.name, self.before.shape(blk.name), blk.start, blk.stop, scratch=scratch)
            else:
                b["mask"] = scratch.take("unmasked", torch.uint8, b["before"].numel()).zero_()
            self._pair_pass(blk, b, scratch)
        return b

    def _scratch(self) -> Scratch:
        """This worker thread's block buffers (a block is finished before its thread reads the next)."""
        scratch = getattr(self._thread_state, "scratch", None)
        if scratch is None:
            scratch = self._thread_state.scratch = Scratch()
        return scratch

    def _pair_pass(self, blk: _Block, b: dict[str, torch.Tensor], scratch: Scratch) -> None:
        """Add the block's categories, |δ|, |θ_before| and sums (:func:`pair_pass`: one compiled pass), after
        the before/after NaN/inf check it also does (a bad value is reported as :meth:`Checkpoint.read` does)."""
        o = b["before"].reshape(-1).contiguous()
        u = b["after"].reshape(-1).contiguous()
        packed = b["mask"].reshape(-1).contiguous()
        if packed.dtype not in (torch.uint8, torch.int32):
            packed = packed.to(torch.int32)
        n = o.numel()
        delta, before_abs = scratch.take("delta", torch.float32, n), scratch.take("before_abs", torch.float32, n)
        cats, sums = scratch.take("cats", torch.uint8, n), np.zeros(10)  # Σ|δ|, Σδ², ΣΔ² / count per category, bad
        forget_bits, retain_bits = np.int32(self.masks.forget_bits), np.int32(self.masks.retain_bits)
        pair_pass(o.numpy(), u.numpy(), packed.numpy(), forget_bits, retain_bits, delta.numpy(), before_abs.numpy(),
                  cats.numpy(), sums)  # fmt: skip
        for label, bad in (("before", sums[8]), ("after", sums[9])):
            if bad:
                file = self._sources(False)[label].info(blk.name).file
                raise CheckpointError(
                    f"{file}: tensor {blk.name!r} contains {int(bad)} NaN/inf values (rows {blk.start}-{blk.stop})"
                )
        b.update(delta=delta, before_abs=before_abs, cats=cats, sums=sums)

    # -- the walk -----------------------------------------------------------------------------------

    def run(self, on_pair: PairHook | None = None, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Stream all tensors; return the localization section of the score JSON."""
        self._on_pair, self._progress = on_pair, progress
        with ThreadPoolExecutor(max_workers=self.config.threads, thread_name_prefix="lacuna-auc") as self._pool:
            started = time.perf_counter()
            if self.composite_features():  # sklearn's imports and first fit (~1.5 s) overlap with the walk's reads
                self._warmed = self._pool.submit(warm_composite)
            # torch's idle OpenMP workers would spin: the walk parallelises by itself
            with _torch_threads(1), _gc_frozen():  # see both helpers for why
                self._walk()
            self.timings["walk_seconds"] = round(time.perf_counter() - started, 3)
            return self._results()

    def _walk(self) -> None:
        for key, names in self._units():
            if key is None:
                self._pass(self._plan(names), universe=False, collect=None, group=None)
                continue
            members = [n for n in names if n in self._members]
            per_block: dict[int, tuple[str, np.ndarray, list[float]]] = {}
            scoring: _GroupScoring | None = None
            fits = sum(self.masks.numel(n) for n in members) <= self.config.group_buffer_scalars
            buffered = not self.one_pass and fits  # the group-normalised scores from buffers after the read
            if self.one_pass or buffered:  # score while reading
                group = (key, members)
                scoring = self._pass(
                    self._plan(names), universe=True, collect=per_block, group=group, buffered=buffered
                )
                self._finish_group(key, names, members, per_block)
                if buffered:  # one worker scores them while the others read the next group
                    self._wait_buffered()  # at most one group's buffers waiting: bounds the memory
                    self._buffered_task = self._pool.submit(self._score_buffered, scoring, dict(self._control_mean))
            else:
                self._pass(self._plan(names), universe=True, collect=per_block, group=None)
                self._finish_group(key, names, members, per_block)
                if members:  # second pass: the group is in the page cache now
                    scoring = self._pass(self._plan(members), universe=True, collect=None, group=(key, members))
                    self._reread_groups += 1
            if scoring is not None:
                self._end_group(scoring)
            if self._whole_tensor_buffers:
                release_memory()
        self._wait_buffered()

    def _wait_buffered(self) -> None:
        """Wait for the last buffered group's scores (re-raising its error)."""
        if self._buffered_task is not None:
            pending, self._buffered_task = self._buffered_task, None
            pending.result()

    @property
    def _whole_tensor_buffers(self) -> bool:
        """Whether groups allocate tensor-sized buffers (qtile/crossfield inputs): freed, they fragment the heap,
        so each group ends with a trim. Block buffers are just reused."""
        return "qtile" in self.scores or "crossfield" in self.scores

    @property
    def one_pass(self) -> bool:
        """True when no requested score or composite feature needs a group statistic (σ, mean control δ′)."""
        wanted = {*self.scores, *self.composite_features()}
        return not wanted & {"layernorm", "contrastln", "compnorm"}

    def _pass(
        self,
        blocks: list[_Block],
        *,
        universe: bool,
        collect: dict[int, tuple[str, np.ndarray, list[float]]] | None,
        group: tuple[tuple[int, str], list[str]] | None,
        buffered: bool = False,
    ) -> _GroupScoring | None:
        """Process ``blocks`` on the worker threads, each block whole (read, pair pass, scores, histograms).

        ``collect`` receives every block's sums (first pass, or the only one), keyed by block number so that they
        are added in file order; ``group`` = (key, members) scores the members' blocks into the accumulators and
        returns the group's scoring state (for :meth:`_end_group`); with ``buffered`` the group-normalised scores
        are left to :meth:`_score_buffered`.
        Workers run the ``on_pair``/``progress`` hooks in block order (a turnstile), and results never depend on
        the number of threads: sums are folded in order, histograms are counts, and samples are keyed by block.
        """
        scoring = None
        if group is not None:
            scoring = self._start_group(group[0], group[1], blocks, buffered=buffered)
        hooks = collect is not None or not universe
        inflight: list[tuple[int, Future[None]]] = []
        failed: list[tuple[int, BaseException]] = []

        def settle(futures: list[tuple[int, Future[None]]]) -> None:
            for seq, future in futures:
                if (exc := future.exception()) is not None:  # waits for the block
                    failed.append((seq, exc))
                    self._abort = True  # the blocks still in flight skip their work

        limit = self.config.threads + 1  # blocks read or scored at once: bounds the memory
        try:
            for blk in blocks:
                while len(inflight) >= limit and not failed:
                    done, _ = wait([f for _, f in inflight], return_when=FIRST_COMPLETED)
                    settle([(seq, f) for seq, f in inflight if f in done])
                    inflight = [(seq, f) for seq, f in inflight if f not in done]
                if failed:
                    break
                inflight.append((blk.seq, self._pool.submit(self._block_task, blk, universe, collect, hooks, scoring)))
        finally:
            self._abort = self._abort or bool(failed)
            settle(inflight)  # never cancel: a later block may be waiting for an earlier one's turn
            self._abort = False
        if failed:
            raise min(failed, key=lambda f: f[0])[1]  # the first bad block in file order, as a sequential read
        return scoring

    def _block_task(
        self,
        blk: _Block,
        universe: bool,
        collect: dict[int, tuple[str, np.ndarray, list[float]]] | None,
        hooks: bool,
        scoring: _GroupScoring | None,
    ) -> None:
        b: dict[str, torch.Tensor] | None = None
        try:
            if not self._abort:
                b = self._read(blk, universe)
        finally:
            with self._turnstile.turn(blk.seq):  # always taken, so later blocks never wait for a failed one
                if b is not None and hooks and not self._abort:
                    if self._on_pair is not None:
                        self._on_pair(blk.name, b["before"], b["after"])
                    if self._progress is not None:
                        self._progress(b["before"].numel())
        if b is None or self._abort:
            return
        if collect is not None and universe:
            collect[blk.seq] = (blk.name, b["sums"], self._control_sums(b))
        if scoring is not None and blk.name in scoring.tensors:
            self._score_block(blk, b, scoring)

    @staticmethod
    def _control_sums(b: dict[str, torch.Tensor]) -> list[float]:
        """Σ|δ′| of the control pair and Σc, Σc² of the contrast c = |δ| − |δ′| (float64)."""
        if "control_before" not in b:
            return [0.0, 0.0, 0.0]
        delta = (b["after"] - b["before"]).reshape(-1).double().abs()
        dc = (b["control_after"] - b["control_before"]).reshape(-1).double().abs()
        contrast = delta - dc
        return [float(dc.sum()), float(contrast.sum()), float((contrast * contrast).sum())]

    def _finish_group(
        self,
        key: tuple[int, str],
        names: list[str],
        members: list[str],
        per_block: dict[int, tuple[str, np.ndarray, list[float]]],
    ) -> None:
        """Fold the group's per-block sums (in file order) into its statistics and the universe counts: the σ sums
        over every tensor of the group (``names``), the counts and update energy over its universe ``members``."""
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
        stats = _GroupStats()
        for n in names:  # in file order: the sums do not depend on which tensors are scored
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
                self._counts[c] += t["k"][c]
        if members:
            self._group_stats[key] = stats
            self._group_tensors[key] = members
            self._universe.extend(members)
        self._control_mean = {n: per_tensor[n]["dc"] / max(1, sum(per_tensor[n]["k"])) for n in members}

    def _start_group(
        self, key: tuple[int, str], members: list[str], blocks: list[_Block], *, buffered: bool = False
    ) -> _GroupScoring:
        """Per-group scoring state: σ, the group accumulator, whole-tensor buffers and the composite's samples."""
        stats = None if buffered else self._group_stats.get(key)
        group_acc = self._group_acc  # the per-layer score goes here, then into the universe's accumulator
        group_acc.reset()
        group_acc.expect(sum(self.masks.numel(n) for n in members))
        scoring = _GroupScoring(
            key=key,
            sigma=stats.sigma("delta") if stats is not None else 0.0,  # two-pass mode only: one pass needs no σ
            sigma_contrast=stats.sigma("contrast") if stats is not None else 0.0,
            buffered=buffered,
        )
        need_delta = "qtile" in self.scores or buffered
        need_contrast = buffered and self.control is not None
        for name in members:  # in file order: the composite's random samples do not depend on threads
            numel = self.masks.numel(name)
            full: dict[str, torch.Tensor] = {"cats": torch.empty(numel, dtype=torch.uint8)}
            if need_delta:
                full["delta"] = torch.empty(numel, dtype=torch.float32)
            if need_contrast:
                full["contrast"] = torch.empty(numel, dtype=torch.float32)
            for i in range(len(self.crossfield)):
                full[f"crossfield{i}"] = torch.empty(numel, dtype=torch.float32)
            left = sum(1 for blk in blocks if blk.name == name)
            scoring.tensors[name] = _TensorState(full=full, sample=self._sample_indices(numel), blocks_left=left)
        return scoring

    def _score_block(self, blk: _Block, b: dict[str, torch.Tensor], scoring: _GroupScoring) -> None:
        """Scores of one member block into the accumulators (each under its lock), the tensor's buffers and the
        composite's sample; the block that completes its tensor also scores the whole tensor (qtile, crossfield)."""
        cfg, per_layer = self.config, self.per_layer_score
        later = GROUP_NORMALISED if scoring.buffered else ()  # scored from the buffers once σ is known
        wanted = [
            s for s in (*self.scores, *self.baselines) if (s in _ELEMENTWISE or s in BASELINES) and s not in later
        ]
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
        feeds = [(self._acc[s], scores[s]) for s in wanted if s != per_layer]
        if per_layer == "raw":
            feeds.append((self._group_acc, b["delta"]))
        self._add_all(feeds, cat)
        lo, hi = blk.lo, blk.hi
        state.full["cats"][lo:hi] = cat
        if "delta" in state.full:
            state.full["delta"][lo:hi] = b["delta"]
        if "contrast" in state.full:
            state.full["contrast"][lo:hi] = scores["contrast"]
        for i in range(len(self.crossfield)):
            state.full[f"crossfield{i}"][lo:hi] = (b[f"crossfield{i}"].reshape(-1) - o).abs()
        sample = state.sample
        if feature_names and sample.size:
            picked = sample[np.searchsorted(sample, lo) : np.searchsorted(sample, hi)] - lo  # sample is sorted
            if picked.size:
                idx = torch.from_numpy(picked)
                # a group-normalised feature is a placeholder until _score_buffered fills it in
                columns = [
                    scores[f][idx].double().numpy() if f in scores else np.zeros(idx.numel()) for f in feature_names
                ]
                scoring.samples[blk.seq] = (np.stack(columns, axis=1), cat[idx].numpy())
                if scoring.buffered:
                    scoring.sample_rows[blk.seq] = (blk.name, picked + lo)
        with self._state_lock:
            state.blocks_left -= 1
            last = state.blocks_left == 0
        if last:
            self._finish_tensor(blk.name, state.full, keep_delta=scoring.buffered)
            if not scoring.buffered:
                state.full = {}

    def _add_all(self, feeds: list[tuple[StreamingAUC, torch.Tensor]], cats: torch.Tensor) -> None:
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

    def _end_group(self, scoring: _GroupScoring) -> None:
        """The group's AUCs, its accumulator merged into the universe's, its samples kept in file order."""
        for seq in sorted(scoring.samples):
            features, cats = scoring.samples[seq]
            self._features.append(features)
            self._feature_cats.append(cats)
        group_acc = self._group_acc
        results = {t: group_acc.result(t) for t in TARGETS}
        self._group_auc[scoring.key] = {t: (r.value, r.error_bound) for t, r in results.items()}
        if self.per_layer_score in self._acc:
            group_acc.merge_into(self._acc[self.per_layer_score])

    def _score_buffered(self, scoring: _GroupScoring, control_mean: Mapping[str, float]) -> None:
        """A buffered group's :data:`GROUP_NORMALISED` scores from its tensors' δ and contrast, now that its σs and
        the tensors' mean control δ′ are known, and those composite features; then its buffers are freed.

        One task: the scores share accumulators (one lock each), so splitting it would only make workers wait."""
        stats = self._group_stats.get(scoring.key)
        if stats is None:  # no member tensors
            return
        sigma, sigma_contrast = stats.sigma("delta"), stats.sigma("contrast")
        todo = [s for s in GROUP_NORMALISED if s in self.scores]
        feature_names = self.composite_features()
        later = [(j, f) for j, f in enumerate(feature_names) if f in GROUP_NORMALISED]

        def normalised(name: str, rows: slice | torch.Tensor, wanted: Sequence[str]) -> dict[str, torch.Tensor]:
            full = scoring.tensors[name].full
            contrast = full["contrast"][rows] if "contrast" in full else None
            mean = control_mean.get(name, 0.0)
            return group_normalised(full["delta"][rows], contrast, sigma, sigma_contrast, mean, wanted=wanted)

        by_value = [s for s in todo if s != "contrastln"]  # functions of δ alone: one update per distinct δ
        step = self.config.block_elems
        rest = np.empty(step, dtype=np.int64)
        for name, state in scoring.tensors.items():
            full, table = state.full, np.zeros(TABLE_KEYS * 3, dtype=np.int64)
            for start in range(0, full["cats"].numel() if todo else 0, step):
                rows = slice(start, start + step)
                cats = full["cats"][rows]
                if "contrastln" in todo:
                    self._add_all(
                        [(self._acc["contrastln"], normalised(name, rows, ["contrastln"])["contrastln"])], cats
                    )
                if by_value:  # the δ that are no bf16 value are scored one by one
                    m = bf16_value_counts(full["delta"][rows].numpy(), cats.numpy(), table, rest)
                    if m:
                        picked = torch.from_numpy(rest[:m]) + start
                        values = normalised(name, picked, by_value)
                        self._add_all([(self._acc[s], values[s]) for s in by_value], full["cats"][picked])
            if table.any():  # the bf16 values of δ, each scored once and added with its count
                nz = np.flatnonzero(table)
                values = torch.from_numpy((nz // 3 << 16).astype(np.int32)).view(torch.float32)
                mean = control_mean.get(name, 0.0)
                scored = group_normalised(values, None, sigma, sigma_contrast, mean, wanted=by_value)
                value_cats, weights = torch.from_numpy((nz % 3).astype(np.uint8)), torch.from_numpy(table[nz])
                for s in by_value:
                    with self._locks[id(self._acc[s])]:
                        self._acc[s].add_counts(scored[s], value_cats, weights)
        for seq, (name, rows) in scoring.sample_rows.items():
            values = normalised(name, torch.from_numpy(rows), [f for _, f in later])
            features = scoring.samples[seq][0]
            for j, f in later:
                features[:, j] = values[f].double().numpy()
        for state in scoring.tensors.values():
            state.full = {}

    def _finish_tensor(self, name: str, full: dict[str, torch.Tensor], keep_delta: bool = False) -> None:
        """Whole-tensor scores: qtile (and the per-group AUC on it) and crossfield, with ties ranked as
        ``config.qtile_ties`` says; ``full`` loses its crossfield buffers, and δ unless ``keep_delta`` (a buffered
        group still needs it)."""
        cat = full["cats"]
        n, step = cat.numel(), self.config.block_elems
        ties = self.config.qtile_ties
        if "qtile" in self.scores:
            delta = full["delta"] if keep_delta else full.pop("delta")
            qtile_acc = self._group_acc if self.per_layer_score == "qtile" else self._acc["qtile"]
            if ties == "average":  # cats by rank and the tie flags: each run of equal δ is one value
                ranked, flags = rank_categories_ties(delta.numpy(), cat.numpy())
                with self._locks[id(qtile_acc)]:
                    qtile_acc.add_ranked_ties(ranked, flags)  # one call: a run split between calls is rescanned
                del flags
            else:
                ranked = torch.from_numpy(rank_categories(delta.numpy(), cat.numpy()))  # cats by rank
                with self._locks[id(qtile_acc)]:
                    for start in range(0, n, step):
                        qtile_acc.add_ranked(start, ranked[start : start + step], n)
            del ranked, delta
            _trim_after(n)
        if "crossfield" in self._acc:
            crossed = torch.full((n,), float("inf"))
            for i in range(len(self.crossfield)):
                torch.minimum(crossed, within_tensor_qtile(full.pop(f"crossfield{i}"), ties), out=crossed)
            with self._locks[id(self._acc["crossfield"])]:
                for start in range(0, n, step):
                    self._acc["crossfield"].add(crossed[start : start + step], cat[start : start + step])

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
        return [f for f in COMPOSITE_FEATURES if self._available.get(_NEEDS.get(f, ""), True)]

    # -- results ------------------------------------------------------------------------------------

    def _results(self) -> dict[str, Any]:
        cfg = self.config
        if not self._universe:
            raise MaskError(f"{self.masks.path}: no tensor has both forget and non-forget scalars; nothing to score")
        auc: dict[str, dict[str, Any]] = {}
        bounds: dict[str, dict[str, float]] = {}
        precision: dict[str, dict[str, Any]] = {}
        baselines: dict[str, dict[str, float | None]] = {}
        roc: dict[str, dict[str, Any]] = {}
        results = {(s, t): acc.result(t) for s, acc in self._acc.items() for t in TARGETS}
        precisions = {
            (s, t): self._acc[s].precision_at(t, cfg.precision_fractions) for s in self.scores for t in TARGETS
        }
        curves = {(s, t): acc.roc_curve(t, cfg.roc_points) for s, acc in self._acc.items() for t in TARGETS}
        # the histograms (tens of MB each) are summarised: free them before the composite's model fits
        self._acc = {s: StreamingAUC(cfg.bins_bits, cfg.exact_limit) for s in self._acc}
        self._group_acc = StreamingAUC(cfg.bins_bits, cfg.exact_limit)
        release_memory()
        started = time.perf_counter()
        composite = self._composite()
        composite_roc = composite.pop("roc", {}) if composite is not None else {}
        self.timings["composite_seconds"] = round(time.perf_counter() - started, 3)  # fits fixed by the definition
        for target in TARGETS:
            auc[target], bounds[target], precision[target], roc[target] = {}, {}, {}, {}
            for s in self.scores:
                auc[target][s] = results[s, target].value
                bounds[target][s] = results[s, target].error_bound
                precision[target][s] = precisions[s, target]
                roc[target][s] = curves[s, target]
            for s in self.not_applicable:
                if s in SCORES:
                    auc[target][s] = None
            if composite is not None:
                auc[target]["composite"] = composite["auc"].get(target)
                if composite_roc.get(target) is not None:  # so the plots can draw the best score when it is this one
                    roc[target]["composite"] = composite_roc[target]
            scored = {s: v for s, v in auc[target].items() if v is not None}
            best = max(scored, key=lambda s: scored[s]) if scored else None
            auc[target]["best"] = {"score": best, "value": scored[best] if best else None}
            baselines[target] = {b: results[b, target].value for b in self.baselines}
            baselines[target].update({b: None for b in BASELINES if b in self.not_applicable})
            for b in self.baselines:
                roc[target][b] = curves[b, target]
        return {
            "auc": auc,
            "auc_error_bound": bounds,
            "precision_at_k": precision,
            "baselines": baselines,
            "not_applicable": dict(self.not_applicable),
            "composite": composite,
            "per_layer": self._per_layer(),
            "universe": {
                "tensors": len(self._universe),
                "scalars": sum(self._counts),
                "forget": self._counts[FORGET],
                "retain": self._counts[RETAIN],
                "outside": self._counts[OUTSIDE],
                "names": list(self._universe),
            },
            "roc": roc,
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

    def _per_layer(self) -> list[dict[str, Any]]:
        rows = []
        for key, stats in sorted(self._group_stats.items()):
            auc = self._group_auc[key]
            energy = sum(stats.energy)
            rows.append(
                {
                    "layer": key[0],
                    "component": key[1],
                    "tensors": self._group_tensors[key],
                    "scalars": stats.n,
                    "auc": {t: auc[t][0] for t in TARGETS},
                    "auc_error_bound": {t: auc[t][1] for t in TARGETS},
                    "update_mass": {
                        "forget": stats.energy[FORGET] / energy if energy else None,
                        "retain": stats.energy[RETAIN] / energy if energy else None,
                        "outside": stats.energy[OUTSIDE] / energy if energy else None,
                    },
                }
            )
        return rows

    def _composite(self) -> dict[str, Any] | None:
        """The composite (docs/definitions.md#localization-precision): 5-fold cross-validated logistic regression on the
        subsample.

        A target whose samples have every feature constant (nothing moved: a zero update) scores 0.5, a constant
        score, without fits: cross-validated, an intercept-only model's probabilities differ between folds only by
        their training folds' class shares, which would rank whole folds against each other (AUC ≈ 0.4999)."""
        names = self.composite_features()
        if not names or not self._features:
            return None
        if self._warmed is not None:
            self._warmed.result()
        x = np.concatenate(self._features)
        cats = np.concatenate(self._feature_cats)
        out: dict[str, Any] = {
            "features": names,
            "samples": int(x.shape[0]),
            "folds": self.config.composite_folds,
        }
        problems: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for target, (pos, neg) in TARGETS.items():
            keep = np.isin(cats, pos + neg)
            y = np.isin(cats[keep], pos)
            if min(int(y.sum()), int((~y).sum())) < self.config.composite_folds:
                continue
            problems[target] = (x[keep], y)
        constant = {t for t, (xt, _y) in problems.items() if bool((xt == xt[:1]).all())}  # no feature varies
        fitted = {t: problems[t] for t in problems if t not in constant}
        probas = out_of_fold_proba(fitted, self.config.composite_folds, self.config.threads)
        aucs = {t: self._pool.submit(roc_auc, proba, problems[t][1]) for t, proba in probas.items()}  # sorts: no GIL
        out["auc"] = {t: 0.5 if t in constant else aucs[t].result() if t in aucs else None for t in TARGETS}
        out["roc"] = {  # out-of-fold probabilities' ROC; a constant score is the diagonal
            t: {"fpr": [0.0, 1.0], "tpr": [0.0, 1.0]}
            if t in constant
            else _sample_roc(probas[t], problems[t][1], self.config.roc_points)
            for t in problems
        }
        return out


def _sample_roc(scores: np.ndarray, positive: np.ndarray, max_points: int) -> dict[str, list[float]]:
    """ROC points of per-sample ``scores`` (ties grouped into one step), as :meth:`StreamingAUC.roc_curve` gives."""
    _values, bins = np.unique(scores, return_inverse=True)
    pos = np.bincount(bins.ravel(), weights=positive.astype(np.float64), minlength=_values.size)
    neg = np.bincount(bins.ravel(), minlength=_values.size) - pos
    return binned_roc(pos, neg, max_points)


def composite_model() -> Any:
    """The composite's classifier (docs/definitions.md#localization-precision): ``StandardScaler`` then
    ``LogisticRegression(C=1, lbfgs, max_iter=1000)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000))


def warm_composite() -> None:
    """Import what the composite's fits use and fit it once on a toy problem (scipy's optimiser loads lazily)."""
    x = np.arange(20, dtype=np.float64).reshape(10, 2)
    composite_model().fit(x, np.arange(10) % 2 == 0)


def out_of_fold_proba(
    problems: Mapping[str, tuple[np.ndarray, np.ndarray]], folds: int, threads: int
) -> dict[str, np.ndarray]:
    """``cross_val_predict(composite_model(), x, y, cv=StratifiedKFold(folds), method="predict_proba")[:, 1]``
    for every ``name: (x, y)``, bit for bit, with all the problems' fits in one pool of ``threads``.

    Why not ``cross_val_predict`` itself: called once per target, each call's pool idles while its last fold
    fits (5 folds on 2 threads), and the three targets' fits run one call after another. Here the 3 × 5 fits are
    scheduled together, largest first, one BLAS/OpenMP thread each (nested pools only contend).
    """
    from sklearn.base import clone
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    model = composite_model()
    out = {name: np.empty(y.size) for name, (_x, y) in problems.items()}
    jobs = [
        (name, train, test)
        for name, (_x, y) in problems.items()
        for train, test in StratifiedKFold(n_splits=folds).split(np.zeros(y.size), y)
    ]

    def fit(job: tuple[str, np.ndarray, np.ndarray]) -> None:
        name, train, test = job
        x, y = problems[name]
        out[name][test] = clone(model).fit(x[train], y[train]).predict_proba(x[test])[:, 1]

    with threadpool_limits(limits=1), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lacuna-lr") as pool:
        for future in [pool.submit(fit, job) for job in sorted(jobs, key=lambda j: -j[1].size)]:
            future.result()
    return out


def required_inputs(scores: Mapping[str, Any]) -> dict[str, str]:
    """Which optional checkpoint each score needs (for docs and error messages)."""
    return {s: _WHY[_NEEDS[s]] for s in scores if s in _NEEDS}
