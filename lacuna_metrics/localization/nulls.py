"""Null updates at the scored update's own scale: what a method-free update of the same size, shape and dtype scores.

A localization AUC is evidence only if an update that knows nothing of the masks cannot reach it. A null drawn at
one fixed size says little about a method whose update is 100-1000x larger (``reversal``'s AUC grows with the
update's size), and a float32 null of ±1e-5 reads |θ|'s binade through rounding. So the nulls here are built from
the scored update itself, on a seeded sample of the universe collected while the scorer walks the pair
(:class:`NullSampler`: no second model in memory, no second walk):

* ``permutation``: the update's own signed δ, permuted within each tensor among scalars of the same |θ_before|
  stratum (binade x quantile bin) and |θ_before − θ_base| quantile bin, so what |θ| alone reveals stays in the null
  and only the placement relative to the masks is forgotten;
* ``theta_noise``: |θ_before| x N(0, 1), scaled per tensor to the update's L2 norm (an update whose size follows |θ|);
* ``weight_decay``: −λ θ_before with λ per tensor matching the update's L2 norm (decoupled weight decay; no draws);
* ``gaussian``: N(0, rms²) with the update's per-tensor RMS.

Every null is added to θ_before and rounded to the dtype ``--after`` stores that tensor in, as a saved method-free
checkpoint would be. Each random kind is drawn ``draws`` times (seeded), so the null's spread is estimated, not
assumed. The scores are the families of :mod:`lacuna_metrics.localization.families` on the sample (``qtile`` ranks
within the tensor's sample, the group σs and the control mean are the sample's), and the AUCs are exact on the
sample. The method's own update is scored on the same sample, so its lift over the null compares like with like
(docs/scoring.md, "Null calibration").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from lacuna_metrics.localization.auc import TARGETS
from lacuna_metrics.localization.composite import fit_composite
from lacuna_metrics.localization.families import score_block, within_tensor_qtile
from lacuna_metrics.localization.group_stats import group_key
from lacuna_tasks import stable_seed

__all__ = [
    "NULL_KINDS",
    "RANDOM_KINDS",
    "ROUNDED_DTYPES",
    "NullSample",
    "NullSampler",
    "null_deltas",
    "sample_aucs",
    "target_aucs",
]

#: The null kinds, in report order, with what each one is (recorded in score.json).
NULL_KINDS: dict[str, str] = {
    "permutation": "the update's own signed delta permuted within each tensor, within strata of |theta_before| "
    "(binade x 8 quantile bins) and |theta_before - theta_base| (8 quantile bins)",
    "theta_noise": "|theta_before| x N(0, 1), scaled per tensor to the update's L2 norm",
    "weight_decay": "-lambda x theta_before, lambda per tensor matching the update's L2 norm (no draws)",
    "gaussian": "N(0, 1) x the update's per-tensor RMS",
}
#: Stored dtypes a null update is rounded to: narrower than the scorer's float32.
ROUNDED_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
#: Kinds with a random draw (the others are one deterministic update).
RANDOM_KINDS: tuple[str, ...] = ("permutation", "theta_noise", "gaussian")
_QBINS = 8


@dataclass
class NullSample:
    """The sampled scalars of the universe, concatenated tensor by tensor in walk order (float32 unless noted).

    ``tensor``/``group``: int32 index into ``names``/``groups`` per scalar; ``cats``: uint8 category; ``before``,
    ``after``, ``base`` (None without a reference), ``control`` (|δ′| of the control pair, None without one);
    ``rounding``: per tensor, the dtype ``--after`` stores it in when narrower than float32 (None: not rounded).
    """

    names: list[str]
    groups: list[tuple[int, str]]
    tensor: np.ndarray
    group: np.ndarray
    cats: np.ndarray
    before: torch.Tensor
    after: torch.Tensor
    base: torch.Tensor | None
    control: torch.Tensor | None
    rounding: list[torch.dtype | None]
    universe_scalars: int

    @property
    def size(self) -> int:
        return int(self.cats.size)

    def spans(self) -> Iterator[tuple[int, slice]]:
        """(tensor index, its slice of the sample), in order."""
        bounds = np.flatnonzero(np.diff(self.tensor)) + 1
        starts = np.concatenate(([0], bounds)).astype(np.int64)
        stops = np.concatenate((bounds, [self.size])).astype(np.int64)
        for lo, hi in zip(starts, stops, strict=True):
            if hi > lo:
                yield int(self.tensor[lo]), slice(int(lo), int(hi))


class NullSampler:
    """Collects a seeded sample of the universe's scalars while :class:`~lacuna_metrics.localization.precision.
    Localization` scores them (``take`` from each member block, any thread): the same fraction of every tensor,
    indices drawn per tensor from ``stable_seed(seed, "null-sample", name)`` so the sample does not depend on the
    block size, the thread count or which other tensors are scored."""

    def __init__(
        self,
        members: Sequence[str],
        numel: Mapping[str, int],
        *,
        samples: int,
        seed: int,
        rounding: Mapping[str, torch.dtype | None],
        base: bool,
        control: bool,
    ) -> None:
        if samples < 1:
            raise ValueError(f"null calibration needs at least one sampled scalar, got {samples}")
        total = sum(int(numel[n]) for n in members)
        fraction = min(1.0, samples / max(1, total))
        self.names = list(members)
        self.universe_scalars = total
        self._index: dict[str, np.ndarray] = {}
        self._offset: dict[str, int] = {}
        offset = 0
        for name in self.names:
            n = int(numel[name])
            k = min(n, max(1, round(n * fraction)))
            rng = np.random.default_rng(stable_seed(seed, "null-sample", name))
            idx = np.arange(n, dtype=np.int64) if k == n else np.sort(rng.choice(n, size=k, replace=False))
            self._index[name], self._offset[name] = idx, offset
            offset += k
        self.before = torch.empty(offset, dtype=torch.float32)
        self.after = torch.empty(offset, dtype=torch.float32)
        self.base = torch.empty(offset, dtype=torch.float32) if base else None
        self.control = torch.empty(offset, dtype=torch.float32) if control else None
        self.cats = np.empty(offset, dtype=np.uint8)
        self.rounding = [rounding.get(n) for n in self.names]
        self._seen: dict[str, int] = dict.fromkeys(self.names, 0)
        self._lock = threading.Lock()

    def take(
        self,
        name: str,
        lo: int,
        hi: int,
        before: torch.Tensor,
        after: torch.Tensor,
        cats: torch.Tensor,
        *,
        base: torch.Tensor | None = None,
        control: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Keep the sampled scalars of rows ``[lo, hi)`` (flat indices) of ``name`` from one scored block."""
        idx = self._index.get(name)
        if idx is None:
            return
        a, b = int(np.searchsorted(idx, lo)), int(np.searchsorted(idx, hi))
        if a == b:
            return
        local = torch.from_numpy(idx[a:b] - lo)
        at = slice(self._offset[name] + a, self._offset[name] + b)
        self.before[at] = before.reshape(-1)[local]
        self.after[at] = after.reshape(-1)[local]
        self.cats[at] = cats.reshape(-1)[local].numpy()
        if self.base is not None and base is not None:
            self.base[at] = base.reshape(-1)[local]
        if self.control is not None and control is not None:
            self.control[at] = (control[1].reshape(-1)[local] - control[0].reshape(-1)[local]).abs()
        with self._lock:
            self._seen[name] += b - a

    def result(self) -> NullSample:
        """The collected sample (every sampled scalar must have been taken: else a bug in the walk)."""
        short = [n for n in self.names if self._seen[n] != self._index[n].size]
        if short:
            raise RuntimeError(f"null sample incomplete for {short[:3]}: the walk did not score every block")
        groups: list[tuple[int, str]] = []
        group_of: dict[tuple[int, str], int] = {}
        tensor = np.empty(self.cats.size, dtype=np.int32)
        group = np.empty(self.cats.size, dtype=np.int32)
        for i, name in enumerate(self.names):
            key = group_key(name)
            if key not in group_of:
                group_of[key] = len(groups)
                groups.append(key)
            at = slice(self._offset[name], self._offset[name] + self._index[name].size)
            tensor[at], group[at] = i, group_of[key]
        return NullSample(
            names=self.names,
            groups=groups,
            tensor=tensor,
            group=group,
            cats=self.cats,
            before=self.before,
            after=self.after,
            base=self.base,
            control=self.control,
            rounding=self.rounding,
            universe_scalars=self.universe_scalars,
        )


# -- null updates on the sample ----------------------------------------------------------------------------------


def null_deltas(sample: NullSample, kind: str, draw: int, seed: int) -> torch.Tensor:
    """The stored update (after rounding to ``--after``'s dtype) of null ``kind``, draw ``draw``, on the sample."""
    if kind not in NULL_KINDS:
        raise ValueError(f"unknown null kind {kind!r}; choose from {list(NULL_KINDS)}")
    o = sample.before
    d = sample.after - o
    gen = np.random.default_rng(stable_seed("null", kind, seed, draw))
    out = torch.empty_like(d)
    for t, span in sample.spans():
        dt, ot = d[span].double(), o[span].double()
        norm_d, norm_o = float(dt.norm()), float(ot.norm())
        if kind == "permutation":
            out[span] = _stratified_permutation(sample, span, d[span], gen)
        elif kind == "gaussian":
            rms = norm_d / max(1, dt.numel()) ** 0.5
            out[span] = torch.from_numpy(gen.standard_normal(dt.numel()).astype(np.float32)) * rms
        elif kind == "theta_noise":
            scale = norm_d / norm_o if norm_o > 0 else 0.0
            noise = torch.from_numpy(gen.standard_normal(dt.numel()).astype(np.float32))
            out[span] = o[span].abs() * noise * scale
        else:  # weight_decay
            lam = norm_d / norm_o if norm_o > 0 else 0.0
            out[span] = o[span] * (-lam)
        dtype = sample.rounding[t]
        if dtype is not None:  # what saving the null update in --after's dtype keeps
            out[span] = (o[span] + out[span]).to(dtype).to(torch.float32) - o[span]
    return out


def _stratified_permutation(sample: NullSample, span: slice, d: torch.Tensor, gen: np.random.Generator) -> torch.Tensor:
    """``d`` permuted among the tensor's scalars of equal stratum (see :data:`NULL_KINDS`)."""
    magnitude = sample.before[span].abs().numpy()
    cell = _quantile_bins(magnitude) * 64 + np.clip(np.frexp(magnitude)[1] + 32, 0, 63)
    if sample.base is not None:
        injection = (sample.before[span] - sample.base[span]).abs().numpy()
        cell = cell * _QBINS + _quantile_bins(injection)
    source = np.argsort(cell, kind="stable")  # positions grouped by cell, in index order
    target = np.lexsort((gen.random(cell.size), cell))  # the same cells, in random order within each
    out = torch.empty_like(d)
    out[torch.from_numpy(target)] = d[torch.from_numpy(source)]
    return out


def _quantile_bins(values: np.ndarray) -> np.ndarray:
    """0..7: which octile of ``values`` each one is in (ties share a bin)."""
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    edges = np.quantile(values, np.linspace(0, 1, _QBINS + 1)[1:-1])
    return np.searchsorted(edges, values, side="right").astype(np.int64)


# -- scores and AUCs on the sample -------------------------------------------------------------------------------


def sample_scores(
    sample: NullSample, d: torch.Tensor, families: Sequence[str], *, ties: str = "average", eps: float = 1e-10
) -> dict[str, np.ndarray]:
    """Every family of ``families`` (elementwise, group and ``qtile``; no ``crossfield``) for the update ``d`` on
    the sample: the scorer's formulas, with the group σs, the tensor's control mean and the qtile ranks taken over
    the sample."""
    delta = d.abs()
    contrast = delta - sample.control if sample.control is not None else None
    sigma = _group_sigma(sample, delta)
    sigma_c = _group_sigma(sample, contrast) if contrast is not None else None
    out = {f: np.empty(sample.size, dtype=np.float32) for f in families}
    elementwise = [f for f in families if f not in ("qtile", "crossfield")]
    for _t, span in sample.spans():
        g = int(sample.group[span.start])
        o = sample.before[span]
        control = (torch.zeros_like(o), sample.control[span]) if sample.control is not None else None
        scores = score_block(
            o,
            o + d[span],
            base=sample.base[span] if sample.base is not None else None,
            control=control,
            sigma=sigma[g],
            sigma_contrast=sigma_c[g] if sigma_c is not None else 0.0,
            control_mean=float(sample.control[span].double().mean()) if sample.control is not None else 0.0,
            eps=eps,
            wanted=elementwise,
            delta=delta[span],
        )
        for f in elementwise:
            out[f][span] = scores[f].numpy()
        if "qtile" in out:
            out["qtile"][span] = within_tensor_qtile(delta[span], ties).numpy()
    return out


def _group_sigma(sample: NullSample, values: torch.Tensor) -> list[float]:
    """Population std of ``values`` per (layer, component) group of the sample."""
    g = torch.from_numpy(sample.group.astype(np.int64))
    n = torch.bincount(g, minlength=len(sample.groups)).double()
    v = values.double()
    s1 = torch.zeros(len(sample.groups), dtype=torch.float64).index_add_(0, g, v)
    s2 = torch.zeros(len(sample.groups), dtype=torch.float64).index_add_(0, g, v * v)
    var = (s2 / n.clamp_min(1) - (s1 / n.clamp_min(1)) ** 2).clamp_min(0)
    return [float(x) for x in var.sqrt()]


def target_aucs(scores: np.ndarray, cats: np.ndarray) -> dict[str, float | None]:
    """Exact ROC-AUC (ties one half) of ``scores`` for every target of :data:`TARGETS` from one sort; a target
    without both classes is None."""
    scores = np.asarray(scores).ravel() + 0.0  # -0 == +0; float32 scores stay float32 (half the sort's time)
    if np.isnan(scores).any():
        raise ValueError("null calibration: NaN scores")
    order = np.argsort(scores)  # equal scores are grouped into runs below, so their order does not matter
    s, c = scores[order], np.asarray(cats).ravel()[order]
    starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1))
    per_run = {k: np.add.reduceat((c == k).astype(np.int64), starts) for k in range(3)} if s.size else {}
    out: dict[str, float | None] = {}
    for target, (pos, neg) in TARGETS.items():
        if not s.size:
            out[target] = None
            continue
        p = sum(per_run[k] for k in pos).astype(np.float64)
        n = sum(per_run[k] for k in neg).astype(np.float64)
        n_pos, n_neg = p.sum(), n.sum()
        if n_pos == 0 or n_neg == 0:
            out[target] = None
            continue
        below = np.cumsum(n) - n
        out[target] = float((p * (below + 0.5 * n)).sum() / (n_pos * n_neg))
    return out


def sample_aucs(
    sample: NullSample,
    d: torch.Tensor,
    families: Sequence[str],
    *,
    composite: Sequence[str] = (),
    composite_rows: np.ndarray | None = None,
    folds: int = 5,
    threads: int = 1,
    ties: str = "average",
) -> dict[str, dict[str, float | None]]:
    """``{family: {target: AUC}}`` of update ``d`` on the sample; with ``composite`` (its feature names) also the
    composite, refitted on the sample's rows ``composite_rows`` with those features of ``d``."""
    wanted = list(dict.fromkeys([*families, *composite]))
    scores = sample_scores(sample, d, wanted, ties=ties)
    out = {f: target_aucs(scores[f], sample.cats) for f in families}
    if composite:
        rows = composite_rows if composite_rows is not None else np.arange(sample.size)
        x = np.stack([scores[f][rows].astype(np.float64) for f in composite], axis=1)
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lacuna-null") as pool:
            fitted = fit_composite(
                list(composite), [x], [sample.cats[rows]], folds=folds, threads=threads, roc_points=2, pool=pool
            )
        out["composite"] = dict(fitted["auc"])
    return out
