"""The scoring families of docs/definitions.md#localization-precision: pure formulas and one registry.

Each family is one function of a block's terms (or, for the whole-tensor ranks, of a tensor) and one
:data:`FAMILIES` entry saying what it needs (a reference ``base``, the unmasked ``control`` pair, the
``crossfield`` runs), when it can be computed (``elementwise``: from the block alone; ``group``: normalised by a
statistic of its (layer, component) group or tensor, known after the group's last block; ``tensor``: ranks within
the whole tensor) and whether it is one of the composite's features. Adding a score is one function plus one
entry; :data:`SCORES`, :data:`BASELINES`, :data:`COMPOSITE_FEATURES` and :func:`required_inputs` are read from
the registry. The scorer (:mod:`lacuna_metrics.localization.precision`) decides which blocks reach these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lacuna_metrics.kernels import categorize, qtile_ties_values, stable_order, stable_sorted_ties
from lacuna_metrics.localization.auc import qtile_values

__all__ = [
    "BASELINES",
    "COMPOSITE_FEATURES",
    "ELEMENTWISE",
    "GROUP_NORMALISED",
    "INPUTS",
    "QTILE_TIES",
    "FAMILIES",
    "SCORES",
    "BlockTerms",
    "Family",
    "categories",
    "crossfield_score",
    "group_normalised",
    "required_inputs",
    "score_block",
    "within_tensor_qtile",
    "within_tensor_quantile",
]

#: Why a family is not applicable, by the optional input it needs.
INPUTS: dict[str, str] = {
    "control": "needs the unmasked control pair (--control-before/--control-after)",
    "base": "needs a reference checkpoint (--base)",
    "crossfield": "needs the per-field runs of the same method (--crossfield, at least two)",
}
#: How ``qtile`` (and ``crossfield``, per-layer AUCs) rank tied scores: ``"average"`` (mid-ranks, the default) or
#: ``"ordinal"`` (index order: the release code's stable argsort, for comparison with the paper); docs/scoring.md.
QTILE_TIES: tuple[str, ...] = ("average", "ordinal")


class _lazy:
    """``functools.cached_property`` without its lock (Python < 3.12 holds one lock per property for *all*
    instances, which would serialise the worker threads' tensor ops)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class BlockTerms:
    """The terms the elementwise formulas share for one block (float32, flat), each computed on first use.

    ``delta`` (|u − o|) and ``before_abs`` (|o|) may be passed in when already computed
    (:func:`~lacuna_metrics.kernels.pair_pass`). ``sigma`` / ``sigma_contrast`` are the (layer, component) stds of
    δ and of the contrast, ``control_mean`` the tensor's mean control δ′ (the group families' statistics).
    """

    def __init__(
        self,
        o: torch.Tensor,
        u: torch.Tensor,
        *,
        base: torch.Tensor | None = None,
        control: tuple[torch.Tensor, torch.Tensor] | None = None,
        delta: torch.Tensor | None = None,
        before_abs: torch.Tensor | None = None,
        sigma: float = 0.0,
        sigma_contrast: float = 0.0,
        control_mean: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        self.o, self.u, self.base, self.control = o, u, base, control
        self.sigma, self.sigma_contrast, self.control_mean, self.eps = sigma, sigma_contrast, control_mean, eps
        if delta is not None:
            self.delta = delta
        if before_abs is not None:
            self.before_abs = before_abs

    @_lazy
    def d(self) -> torch.Tensor:
        """The signed update u − o (only the reference scores need the sign)."""
        return self.u - self.o

    @_lazy
    def delta(self) -> torch.Tensor:
        """|δ| = |u − o|."""
        return self.d.abs() if self.base is not None else (self.u - self.o).abs_()

    @_lazy
    def before_abs(self) -> torch.Tensor:
        return self.o.abs()

    @_lazy
    def dc(self) -> torch.Tensor:
        """|δ′|: the control pair's update."""
        assert self.control is not None
        return (self.control[1] - self.control[0]).abs()

    @_lazy
    def contrast(self) -> torch.Tensor | None:
        """|δ| − |δ′| (None without the control pair)."""
        return self.delta - self.dc if self.control is not None else None

    @_lazy
    def inj(self) -> torch.Tensor:
        """The injection θ_before − θ_base."""
        assert self.base is not None
        return self.o - self.base

    @_lazy
    def abs_inj(self) -> torch.Tensor:
        return self.inj.abs()


# -- the formulas (docs/definitions.md#localization-precision) ------------------------------------------------


def raw(t: BlockTerms) -> torch.Tensor:
    return t.delta


def before_magnitude(t: BlockTerms) -> torch.Tensor:
    return t.before_abs


def contrast(t: BlockTerms) -> torch.Tensor:
    assert t.contrast is not None
    return t.contrast


def contrastnorm(t: BlockTerms) -> torch.Tensor:
    denom = t.delta + t.dc
    return torch.where(denom > 1e-12, contrast(t) / denom.clamp_min(1e-12), torch.zeros_like(denom))


def eratio(t: BlockTerms) -> torch.Tensor:
    return t.delta / (t.dc + t.eps)


def signrev(t: BlockTerms) -> torch.Tensor:
    return -(t.inj * t.d)


def reversal(t: BlockTerms) -> torch.Tensor:
    return (t.abs_inj - (t.d + t.inj).abs()) / (t.abs_inj + t.eps)


def dirreversal(t: BlockTerms) -> torch.Tensor:
    return -t.d * torch.sign(t.inj) / (t.abs_inj + t.eps)


def injection_magnitude(t: BlockTerms) -> torch.Tensor:
    return t.abs_inj


def layernorm(t: BlockTerms) -> torch.Tensor:
    """δ / σ of the group; a zero σ (the group did not move) gives 0."""
    return t.delta / t.sigma if t.sigma > 0 else torch.zeros_like(t.delta)


def compnorm(t: BlockTerms) -> torch.Tensor:
    """δ / mean δ′ of the tensor; a zero control mean falls back to δ, as the reference code does."""
    return t.delta / t.control_mean if t.control_mean > 0 else t.delta


def contrastln(t: BlockTerms) -> torch.Tensor:
    """contrast / σ_c of the group; a zero σ_c gives 0."""
    return contrast(t) / t.sigma_contrast if t.sigma_contrast > 0 else torch.zeros_like(t.delta)


def qtile(delta: torch.Tensor, ties: str = "average") -> torch.Tensor:
    """The within-tensor quantile of δ (the scorer streams its ranks instead: the same AUC)."""
    return within_tensor_qtile(delta, ties)


def crossfield_score(deltas: Iterable[torch.Tensor], ties: str = "average") -> torch.Tensor:
    """The minimum over the per-field runs of the within-tensor qtile of |θ_run − θ_before| (one run's buffer at a
    time: ``deltas`` may be a generator)."""
    crossed: torch.Tensor | None = None
    for delta in deltas:
        q = within_tensor_qtile(delta, ties)
        if crossed is None:
            crossed = torch.full((q.numel(),), float("inf"))
        torch.minimum(crossed, q, out=crossed)
    if crossed is None:
        raise ValueError("crossfield needs at least one run")
    return crossed


# -- the registry -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One scoring family: its formula and what the scorer needs to know about it.

    ``kind``: ``elementwise`` (``fn(BlockTerms)``), ``group`` (``fn(BlockTerms)`` once the group's σs / the
    tensor's control mean are known) or ``tensor`` (ranks within the whole tensor). ``needs``: the optional input
    (a key of :data:`INPUTS`). ``feature``: position among the composite's features (None: not one). ``baseline``:
    a method-free detector reported under ``baselines``, not a score.
    """

    name: str
    fn: Callable[..., torch.Tensor]
    kind: str = "elementwise"
    needs: str | None = None
    feature: int | None = None
    baseline: bool = False


#: Every family in docs/definitions.md#localization-precision's order, then the baselines.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("raw", raw, feature=0),
        Family("qtile", qtile, kind="tensor"),
        Family("layernorm", layernorm, kind="group", feature=1),
        Family("compnorm", compnorm, kind="group", needs="control", feature=9),
        Family("signrev", signrev, needs="base", feature=2),
        Family("reversal", reversal, needs="base", feature=3),
        Family("dirreversal", dirreversal, needs="base", feature=4),
        Family("contrast", contrast, needs="control", feature=5),
        Family("contrastnorm", contrastnorm, needs="control", feature=6),
        Family("contrastln", contrastln, kind="group", needs="control", feature=7),
        Family("eratio", eratio, needs="control", feature=8),
        Family("crossfield", crossfield_score, kind="tensor", needs="crossfield"),
        Family("before_magnitude", before_magnitude, baseline=True),
        Family("injection_magnitude", injection_magnitude, needs="base", baseline=True),
    )
}
#: Scoring functions (``composite`` is fitted on top of them).
SCORES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if not f.baseline)
#: Method-free magnitude detectors on the same universe: how much a score needs no unlearning at all.
BASELINES: tuple[str, ...] = tuple(n for n, f in FAMILIES.items() if f.baseline)
#: The composite's ten features in its column order; those available for the run are used.
COMPOSITE_FEATURES: tuple[str, ...] = tuple(
    sorted((n for n, f in FAMILIES.items() if f.feature is not None), key=lambda n: FAMILIES[n].feature or 0)
)
#: Families computed from a block alone (the rest rank whole tensors).
ELEMENTWISE: tuple[str, ...] = tuple(n for n in SCORES if FAMILIES[n].kind != "tensor")
#: Scores normalised by a statistic of their whole (layer, component) group or tensor: known after its last block.
GROUP_NORMALISED: tuple[str, ...] = tuple(n for n in SCORES if FAMILIES[n].kind == "group")


def required_inputs(scores: Iterable[str]) -> dict[str, str]:
    """Which optional checkpoint each score needs (for docs and error messages)."""
    return {s: INPUTS[f.needs] for s in scores if (f := FAMILIES.get(s)) is not None and f.needs is not None}


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
    wanted: Sequence[str] = (*ELEMENTWISE, *BASELINES),
    delta: torch.Tensor | None = None,
    before_abs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Elementwise and group scores among ``wanted`` of one block (float32); families whose input is absent are
    skipped (see :class:`BlockTerms` for the arguments)."""
    norms = {"sigma": sigma, "sigma_contrast": sigma_contrast, "control_mean": control_mean, "eps": eps}
    terms = BlockTerms(o, u, base=base, control=control, delta=delta, before_abs=before_abs, **norms)
    have = {"base": base is not None, "control": control is not None}
    want = set(wanted)
    return {
        n: f.fn(terms)
        for n, f in FAMILIES.items()
        if n in want and f.kind != "tensor" and have.get(f.needs or "", True)
    }


def group_normalised(
    delta: torch.Tensor,
    contrast: torch.Tensor | None,
    sigma: float,
    sigma_contrast: float,
    control_mean: float,
    *,
    wanted: Iterable[str],
) -> dict[str, torch.Tensor]:
    """The :data:`GROUP_NORMALISED` scores among ``wanted`` from δ (and the contrast, when given), now that the
    group's statistics are known: the same formulas as the block-by-block scoring, for a group's buffers (or their
    distinct δ values)."""
    terms = BlockTerms(delta, delta, delta=delta, sigma=sigma, sigma_contrast=sigma_contrast, control_mean=control_mean)
    terms.contrast = contrast
    want = set(wanted)
    return {
        n: FAMILIES[n].fn(terms)
        for n in GROUP_NORMALISED
        if n in want and (n != "contrastln" or contrast is not None)  # the only one that reads the contrast
    }


def within_tensor_quantile(delta: torch.Tensor) -> torch.Tensor:
    """The stable order of a tensor's scores: ``order[r]`` is the flat index of the scalar of ordinal rank ``r``.

    A stable argsort (ties keep index order), a radix sort of the scores' order-preserving keys
    (:func:`lacuna_metrics.kernels.stable_order`): the release code's ranks, whose ``r / (n − 1)`` is
    ``qtile_ties="ordinal"`` (see :func:`~lacuna_metrics.localization.auc.qtile_values`). The default qtile gives ties their
    average rank instead (:func:`within_tensor_qtile`).
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


def categories(packed: torch.Tensor, forget_bits: int, retain_bits: int) -> torch.Tensor:
    """uint8 category per scalar: FORGET if any forget bit, else RETAIN if any retain bit, else OUTSIDE."""
    flat = packed.reshape(-1).contiguous()
    if flat.dtype not in (torch.uint8, torch.int32):
        flat = flat.to(torch.int32)
    out = torch.empty(flat.numel(), dtype=torch.uint8)
    categorize(flat.numpy(), np.int32(forget_bits), np.int32(retain_bits), out.numpy())
    return out


def _check_registry(registry: Mapping[str, Any]) -> None:
    """Fail at import on an entry the scorer could not place (a typo in ``kind`` or ``needs``)."""
    for f in registry.values():
        if f.kind not in ("elementwise", "group", "tensor") or (f.needs is not None and f.needs not in INPUTS):
            raise ValueError(f"scoring family {f.name!r}: bad kind {f.kind!r} or needs {f.needs!r}")


_check_registry(FAMILIES)
