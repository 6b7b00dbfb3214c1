"""Localization precision (spec §1.10): did the unlearning update land on the scalars that hold the facts?

Every scalar of the *universe* (masked attention/MLP tensors with both positives and negatives) is one
sample; its label comes from the ground-truth masks and its score from one of the LACUNA scoring
functions of the before/after weights (plus an optional reference ``base`` and an unmasked control
pair). Scores are streamed tensor block by tensor block into :class:`~lacuna_metrics.auc.StreamingAUC`,
so memory is bounded by the largest tensor, never the model.

Two passes per (layer, component) group when a requested score normalises by a group statistic
(``layernorm``, ``contrastln``, ``compnorm``, also as composite features): the first collects σ of δ
and of the contrast per group, the mean control δ′ per tensor and the categories; the second re-reads
the group (now in the page cache) and scores it. Otherwise one pass scores while reading. ``qtile`` and
``crossfield`` need the whole tensor's ranks, so they sort one tensor at a time (a radix sort).

The per-scalar work (categories, sums, histogram updates, the sort) runs in the compiled kernels of
:mod:`lacuna_metrics.kernels`; the histogram updates of different scores run in parallel threads, and
the per-layer score is histogrammed once per group and then merged into the universe's histogram.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lacuna_metrics.auc import FORGET, OUTSIDE, RETAIN, TARGETS, StreamingAUC, qtile_values, roc_auc
from lacuna_metrics.checkpoints import Checkpoint, CheckpointError, prefetched, release_memory
from lacuna_metrics.kernels import categorize, pair_statistics, rank_categories, stable_order
from lacuna_metrics.masks import MaskError, MaskReader, component, layer_index

__all__ = [
    "BASELINES",
    "COMPOSITE_FEATURES",
    "SCORES",
    "Localization",
    "LocalizationConfig",
    "qtile_values",
    "score_block",
    "within_tensor_quantile",
]

#: Scoring functions of spec §1.10, in the spec's order (``composite`` is fitted on top of them).
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
#: The composite's ten features (spec §1.10), those available for the run are used.
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


@dataclass
class LocalizationConfig:
    """Knobs of the localization scorer; defaults follow spec §1.10 where it has a value."""

    scores: tuple[str, ...] | None = None  # None: every applicable score (and composite)
    composite: bool = True
    bins_bits: int = 20  # histogram resolution once more than exact_limit scalars were seen
    exact_limit: int = 1 << 22
    precision_fractions: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1)
    composite_samples: int = 2_000_000
    composite_folds: int = 5
    seed: int = 42
    block_elems: int = 1 << 20  # scalars per read block: larger blocks fragment the heap (peak RSS)
    threads: int = max(1, min(4, os.cpu_count() or 1))  # histogram updates of different scores in parallel

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    eps: float = 1e-10
    roc_points: int = 128


@dataclass
class _GroupStats:
    """First-pass sums of one (layer, component) group over its universe tensors."""

    n: int = 0
    delta: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σδ, Σδ²
    contrast: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σc, Σc²
    energy: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # ΣΔ² outside / retain / forget

    def sigma(self, which: str) -> float:
        s, s2 = getattr(self, which)
        if self.n == 0:
            return 0.0
        var = max(0.0, s2 / self.n - (s / self.n) ** 2)  # population std (ddof=0)
        return math.sqrt(var)


def within_tensor_quantile(delta: torch.Tensor) -> torch.Tensor:
    """Order of spec §1.10's ``qtile``: ``order[r]`` is the flat index of the scalar of rank ``r``.

    Ranks come from a stable argsort (ties keep index order), a radix sort of the scores' order-preserving
    keys (:func:`lacuna_metrics.kernels.stable_order`). ``qtile = r / (n − 1)`` follows from the rank
    (see :func:`qtile_values`).
    """
    flat = delta.reshape(-1).to(torch.float32).contiguous()
    if flat.numel() >= 1 << 32:
        raise ValueError(f"tensor of {flat.numel()} scalars is too large for the 32-bit radix sort")
    return torch.from_numpy(stable_order(flat.numpy()).astype(np.int64))


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
) -> dict[str, torch.Tensor]:
    """Elementwise scores of spec §1.10 for one block (float32); absent inputs skip their scores.

    ``sigma`` / ``sigma_contrast`` are the (layer, component) stds of δ and of the contrast, and
    ``control_mean`` the tensor's mean control δ′. A zero σ gives score 0 (the group did not move);
    a zero control mean makes ``compnorm`` fall back to δ, as the reference code does.
    """
    out: dict[str, torch.Tensor] = {}
    want = set(wanted)
    d = u - o
    delta = d.abs() if base is not None else d.abs_()  # d itself is only needed by the base scores
    if "raw" in want:
        out["raw"] = delta
    if "layernorm" in want:
        out["layernorm"] = delta / sigma if sigma > 0 else torch.zeros_like(delta)
    if "before_magnitude" in want:
        out["before_magnitude"] = o.abs()
    if control is not None:
        dc = (control[1] - control[0]).abs()
        contrast = delta - dc
        if "contrast" in want:
            out["contrast"] = contrast
        if "contrastnorm" in want:
            denom = delta + dc
            out["contrastnorm"] = torch.where(denom > 1e-12, contrast / denom.clamp_min(1e-12), torch.zeros_like(denom))
        if "contrastln" in want:
            out["contrastln"] = contrast / sigma_contrast if sigma_contrast > 0 else torch.zeros_like(delta)
        if "eratio" in want:
            out["eratio"] = delta / (dc + eps)
        if "compnorm" in want:
            out["compnorm"] = delta / control_mean if control_mean > 0 else delta
    if base is not None:
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


def categories(packed: torch.Tensor, forget_bits: int, retain_bits: int) -> torch.Tensor:
    """uint8 category per scalar: FORGET if any forget bit, else RETAIN if any retain bit, else OUTSIDE."""
    flat = packed.reshape(-1).to(torch.int32).contiguous()
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


class Localization:
    """Score one before/after pair against ground-truth masks; see the module docstring.

    ``crossfield`` lists the after-checkpoints of the same method on each field (spec: four).
    ``run(on_pair)`` walks every tensor of the checkpoints once (twice for the universe) and calls
    ``on_pair(name, before_block, after_block)`` for each block, so distances and FRAG share the reads.
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
        self._group_auc: dict[tuple[int, str], dict[str, Any]] = {}  # per-group AUCs, kept as numbers
        self._group_stats: dict[tuple[int, str], _GroupStats] = {}
        self._group_tensors: dict[tuple[int, str], list[str]] = {}
        self._universe: list[str] = []
        self._control_mean: dict[str, float] = {}  # mean control δ′ per tensor of the current group
        self._counts = [0, 0, 0]
        self._features: list[np.ndarray] = []
        self._feature_cats: list[np.ndarray] = []
        self._rng = np.random.default_rng(cfg.seed)
        self.per_layer_score = "qtile" if "qtile" in self.scores else "raw"
        self._members = self._find_universe()
        total = sum(self.masks.numel(n) for n in self._members)
        self._sample_fraction = min(1.0, cfg.composite_samples / max(1, total))

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
        """Candidates with at least one forget scalar and one other scalar (spec §1.10), from the masks alone.

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
        """Tensors in file order, masked ones grouped by (layer, component)."""
        units: list[tuple[tuple[int, str] | None, list[str]]] = []
        index: dict[tuple[int, str], int] = {}
        for name in self.before.names:
            if self.before.is_alias(name):
                continue
            if name in self.candidates:
                key = (layer_index(name) or 0, str(component(name)))
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

    def _blocks(self, names: Sequence[str], universe: bool) -> Iterator[tuple[str, int, int, dict[str, torch.Tensor]]]:
        sources = self._sources(universe)

        def make() -> Iterator[tuple[str, int, int, dict[str, torch.Tensor]]]:
            for name in names:
                shape = self.before.shape(name)
                for start, stop in self.before.iter_blocks(name, self.config.block_elems):
                    blocks = {label: ck.read(name, start, stop) for label, ck in sources.items()}
                    if universe:
                        blocks["mask"] = self.masks.read(name, shape, start, stop)
                    yield name, start, stop, blocks

        return prefetched(make)

    # -- the walk -----------------------------------------------------------------------------------

    def run(self, on_pair: PairHook | None = None, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Stream all tensors; return the localization section of the score JSON."""
        with ThreadPoolExecutor(max_workers=self.config.threads, thread_name_prefix="lacuna-auc") as self._pool:
            return self._run(on_pair, progress)

    def _run(self, on_pair: PairHook | None, progress: Callable[[int], None] | None) -> dict[str, Any]:
        for key, names in self._units():
            if key is None:
                for name, _s, _e, b in self._blocks(names, universe=False):
                    if on_pair is not None:
                        on_pair(name, b["before"], b["after"])
                    if progress is not None:
                        progress(b["before"].numel())
                continue
            members = [n for n in names if n in self._members]
            per_tensor: dict[str, dict[str, Any]] = {}
            if self.one_pass:  # no score normalises by group statistics: score while reading
                blocks = self._with_stats(self._blocks(names, universe=True), per_tensor, None, on_pair, progress)
                self._score_group(key, ((n, s, e, b, c) for n, s, e, b, c in blocks if n in self._members))
                self._finish_group(key, members, per_tensor)
            else:
                cats: dict[str, list[torch.Tensor]] = {}
                for _ in self._with_stats(self._blocks(names, universe=True), per_tensor, cats, on_pair, progress):
                    pass
                self._finish_group(key, members, per_tensor)
                if members:
                    joined = {n: torch.cat(cats.pop(n)) for n in members}
                    self._score_group(key, self._reread(members, joined))
                    del joined
                cats.clear()
            if self._whole_tensor_buffers:
                release_memory()
        return self._results()

    @property
    def _whole_tensor_buffers(self) -> bool:
        """Whether groups allocate tensor-sized buffers (categories kept for a second pass, qtile/crossfield
        inputs): freed, they fragment the heap, so each group ends with a trim. Block buffers are just reused."""
        return not self.one_pass or "qtile" in self.scores or "crossfield" in self.scores

    @property
    def one_pass(self) -> bool:
        """True when no requested score or composite feature needs a group statistic (σ, mean control δ′)."""
        wanted = {*self.scores, *self.composite_features()}
        return not wanted & {"layernorm", "contrastln", "compnorm"}

    def _with_stats(
        self,
        blocks: Iterator[tuple[str, int, int, dict[str, torch.Tensor]]],
        per_tensor: dict[str, dict[str, Any]],
        keep_cats: dict[str, list[torch.Tensor]] | None,
        on_pair: PairHook | None,
        progress: Callable[[int], None] | None,
    ) -> Iterator[tuple[str, int, int, dict[str, torch.Tensor], torch.Tensor]]:
        """Pass blocks through, adding each one's categories and sums to ``per_tensor`` (and ``keep_cats``)."""
        for name, start, stop, b in blocks:
            o, u = b["before"], b["after"]
            if on_pair is not None:
                on_pair(name, o, u)
            if progress is not None:
                progress(o.numel())
            cat = categories(b["mask"], self.masks.forget_bits, self.masks.retain_bits)
            if keep_cats is not None:
                keep_cats.setdefault(name, []).append(cat)
            t = per_tensor.setdefault(
                name, {"n": 0, "d": [0.0, 0.0], "c": [0.0, 0.0], "dc": 0.0, "e": [0.0] * 3, "k": [0] * 3}
            )
            sums = np.zeros(8)  # Σ|δ|, Σδ², ΣΔ² per category, count per category
            pair_statistics(o.reshape(-1).contiguous().numpy(), u.reshape(-1).contiguous().numpy(), cat.numpy(), sums)
            t["n"] += cat.numel()
            t["d"][0] += float(sums[0])
            t["d"][1] += float(sums[1])
            for c in (OUTSIDE, RETAIN, FORGET):
                t["e"][c] += float(sums[2 + c])
                t["k"][c] += int(sums[5 + c])
            if "control_before" in b:
                delta = (u - o).reshape(-1).double().abs()
                dc = (b["control_after"] - b["control_before"]).reshape(-1).double().abs()
                contrast = delta - dc
                t["dc"] += float(dc.sum())
                t["c"][0] += float(contrast.sum())
                t["c"][1] += float((contrast * contrast).sum())
            yield name, start, stop, b, cat

    def _finish_group(self, key: tuple[int, str], members: list[str], per_tensor: dict[str, dict[str, Any]]) -> None:
        """Fold the group's per-tensor sums into its statistics and the universe counts."""
        stats = _GroupStats()
        for n in members:
            t = per_tensor[n]
            stats.n += t["n"]
            for i in range(2):
                stats.delta[i] += t["d"][i]
                stats.contrast[i] += t["c"][i]
            for c in range(3):
                stats.energy[c] += t["e"][c]
                self._counts[c] += t["k"][c]
        if members:
            self._group_stats[key] = stats
            self._group_tensors[key] = members
            self._universe.extend(members)
        self._control_mean = {n: per_tensor[n]["dc"] / max(1, per_tensor[n]["n"]) for n in members}

    def _reread(
        self, members: list[str], cats: dict[str, torch.Tensor]
    ) -> Iterator[tuple[str, int, int, dict[str, torch.Tensor], torch.Tensor]]:
        """Second pass over the group's members (now in the page cache) with the categories of the first."""
        for name, start, stop, b in self._blocks(members, universe=True):
            shape = self.before.shape(name)
            row = math.prod(shape[1:]) if len(shape) > 1 else 1
            yield name, start, stop, b, cats[name][start * row : stop * row]

    def _score_group(
        self, key: tuple[int, str], blocks: Iterator[tuple[str, int, int, dict[str, torch.Tensor], torch.Tensor]]
    ) -> None:
        """Feed every score's accumulators from the group's member blocks (in tensor order)."""
        cfg = self.config
        stats = self._group_stats.get(key)
        sigma = stats.sigma("delta") if stats is not None else 0.0  # two-pass mode only: one pass needs no σ
        sigma_c = stats.sigma("contrast") if stats is not None else 0.0
        # the per-layer score goes to a group accumulator that is then merged into the universe's one
        group_acc = self._group_acc
        group_acc.reset()
        per_layer = self.per_layer_score
        wanted = [s for s in (*self.scores, *self.baselines) if s in _ELEMENTWISE or s in BASELINES]
        feature_names = self.composite_features()
        need_full = "qtile" in self.scores
        current: str | None = None
        full: dict[str, torch.Tensor] = {}
        tensor_cats: list[torch.Tensor] = []
        sample: np.ndarray = np.zeros(0, dtype=np.int64)
        for name, start, stop, b, cat in blocks:
            if name != current:
                if current is not None:
                    self._finish_tensor(current, full, torch.cat(tensor_cats), group_acc)
                current, full, tensor_cats = name, {}, []
                numel = self.masks.numel(name)
                if need_full:
                    full["delta"] = torch.empty(numel, dtype=torch.float32)
                for i in range(len(self.crossfield)):
                    full[f"crossfield{i}"] = torch.empty(numel, dtype=torch.float32)
                sample = self._sample_indices(numel)
            tensor_cats.append(cat)
            shape = self.before.shape(name)
            row = math.prod(shape[1:]) if len(shape) > 1 else 1
            lo, hi = start * row, stop * row
            o, u = b["before"].reshape(-1), b["after"].reshape(-1)
            control = (
                (b["control_before"].reshape(-1), b["control_after"].reshape(-1)) if "control_before" in b else None
            )
            scores = score_block(
                o,
                u,
                base=b["base"].reshape(-1) if "base" in b else None,
                control=control,
                sigma=sigma,
                sigma_contrast=sigma_c,
                control_mean=self._control_mean.get(name, 0.0),
                eps=cfg.eps,
                wanted=wanted + [f for f in feature_names if f not in wanted],
            )
            feeds = [(self._acc[s], scores[s]) for s in wanted if s != per_layer]
            if per_layer == "raw":
                feeds.append((group_acc, scores["raw"] if "raw" in scores else (u - o).abs()))
            pending = [self._pool.submit(acc.add, values, cat) for acc, values in feeds]  # compiled, GIL-free
            if "delta" in full:
                full["delta"][lo:hi] = scores["raw"] if "raw" in scores else (u - o).abs()
            for i in range(len(self.crossfield)):
                full[f"crossfield{i}"][lo:hi] = (b[f"crossfield{i}"].reshape(-1) - o).abs()
            if feature_names and sample.size:
                picked = sample[np.searchsorted(sample, lo) : np.searchsorted(sample, hi)] - lo  # sample is sorted
                if picked.size:
                    idx = torch.from_numpy(picked)
                    self._features.append(np.stack([scores[f][idx].double().numpy() for f in feature_names], axis=1))
                    self._feature_cats.append(cat[idx].numpy())
            for future in pending:
                future.result()  # each accumulator is fed by one task per block, in block order
        if current is not None:
            self._finish_tensor(current, full, torch.cat(tensor_cats), group_acc)
        results = {t: group_acc.result(t) for t in TARGETS}
        self._group_auc[key] = {t: (r.value, r.error_bound) for t, r in results.items()}
        if per_layer in self._acc:
            group_acc.merge_into(self._acc[per_layer])

    def _finish_tensor(
        self, name: str, full: dict[str, torch.Tensor], cat: torch.Tensor, group_acc: StreamingAUC
    ) -> None:
        """Whole-tensor scores: qtile (and the per-group AUC on it) and crossfield."""
        n, step = cat.numel(), self.config.block_elems
        if "delta" in full:
            ranked = torch.from_numpy(rank_categories(full.pop("delta").numpy(), cat.numpy()))  # cats by rank
            qtile_acc = group_acc if self.per_layer_score == "qtile" else self._acc["qtile"]
            for start in range(0, n, step):
                qtile_acc.add_ranked(start, ranked[start : start + step], n)
            del ranked
            _trim_after(n)
        if "crossfield" in self._acc:
            crossed = torch.full((n,), float("inf"))
            for i in range(len(self.crossfield)):
                order = within_tensor_quantile(full.pop(f"crossfield{i}"))
                for start in range(0, n, step):
                    idx = order[start : start + step]
                    crossed[idx] = torch.minimum(crossed[idx], qtile_values(start, start + idx.numel(), n))
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
        composite = self._composite()
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
                "sigma": "population std (ddof=0) over the (layer, component) group",
                "crossfield_runs": len(self.crossfield),
                "passes_per_group": 1 if self.one_pass else 2,
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
        """Spec §1.10 composite: 5-fold cross-validated logistic regression on the subsample."""
        names = self.composite_features()
        if not names or not self._features:
            return None
        from joblib import parallel_backend
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_predict
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        x = np.concatenate(self._features)
        cats = np.concatenate(self._feature_cats)
        out: dict[str, Any] = {
            "features": names,
            "samples": int(x.shape[0]),
            "folds": self.config.composite_folds,
            "auc": {},
        }
        for target, (pos, neg) in TARGETS.items():
            keep = np.isin(cats, pos + neg)
            y = np.isin(cats[keep], pos)
            if min(int(y.sum()), int((~y).sum())) < self.config.composite_folds:
                out["auc"][target] = None
                continue
            model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver="lbfgs", max_iter=1000))
            cv = StratifiedKFold(n_splits=self.config.composite_folds)
            with parallel_backend("threading", n_jobs=self.config.threads):  # folds in parallel, same result
                proba = cross_val_predict(model, x[keep], y, cv=cv, method="predict_proba")[:, 1]
            out["auc"][target] = roc_auc(proba, y)
        return out


def required_inputs(scores: Mapping[str, Any]) -> dict[str, str]:
    """Which optional checkpoint each score needs (for docs and error messages)."""
    return {s: _WHY[_NEEDS[s]] for s in scores if s in _NEEDS}
