"""FRAG: does the unlearning update sit on forget-critical, retain-sparing weights? (docs/definitions.md#frag-score)

With W the ORIGINAL weight (d_out x d_in) and x^f, x^r the forget/retain activation norms of its input
channels (:mod:`lacuna_metrics.frag.activations`):

    F_ij = |W_ij| x^f_j / (x^r_j + eps)     R_ij = |W_ij| x^r_j / (x^f_j + eps)     D_ij = (W^unl_ij - W_ij)^2
    A_f = cos(F, D)    A_r = cos(R, D)    FRAG = A_f - gamma * A_r

The cosines are GLOBAL (of the vectors concatenated over all scored modules), so only five sums per module are
needed. That lets :class:`FragAccumulator` take each tensor in row blocks straight from the checkpoint reader and
never hold a whole model: a 7B pair is scored in a few hundred MB.

A fused MoE tensor ``[E, d_out, d_in]`` (or ``[E, d_in, d_out]``) is E matrices side by side: its x is
``[E, d_in]``, row e measured on the tokens routed to expert e, and F, R, D are formed per expert exactly as
above and enter the same global cosines (docs/anatomy.md, "FRAG"). The result's ``coverage`` says what share of
the block weights was scored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from lacuna_metrics.frag.activations import DEFAULT_MIN_COVERAGE, ActivationStats, coverage_verdict
from lacuna_metrics.weights.checkpoints import Checkpoint, check_compatible
from lacuna_metrics.weights.pair_walk import walk_pair

__all__ = ["FragAccumulator", "frag_score"]

_FD, _RD, _FF, _RR, _DD = range(5)


def _cosine(dot: float, sq_a: float, sq_b: float) -> float:
    """Cosine from a dot product and two squared norms; 0 when either norm is 0 (docs/definitions.md#frag-score)."""
    if sq_a <= 0.0 or sq_b <= 0.0:
        return 0.0
    return dot / (math.sqrt(sq_a) * math.sqrt(sq_b))


class FragAccumulator:
    """Accumulate the FRAG sums tensor by tensor, block by block, then report global and per-module cosines.

    ``x_forget`` / ``x_retain`` map each scored weight name to its input-channel norms (length d_in; ``[E, d_in]``
    for a fused ``[E, ., .]`` expert tensor). Weights in ``conv1d_transposed`` are stored with the input axis first
    (GPT-2 ``Conv1D`` ``(d_in, d_out)``, experts ``[E, d_in, d_out]``). Feed each tensor with :meth:`add` as
    consecutive leading-dimension row blocks of W (before) and W_unl (after).

    ``coverage`` (from :func:`lacuna_metrics.frag.activations.activation_stats`; by default taken from ``x_forget``
    when it carries one) is reported in :meth:`result` with a warning below ``min_coverage``.
    """

    def __init__(
        self,
        x_forget: Mapping[str, torch.Tensor],
        x_retain: Mapping[str, torch.Tensor],
        gamma: float = 1.0,
        eps: float = 1e-6,
        conv1d_transposed: Iterable[str] = (),
        coverage: Mapping[str, Any] | None = None,
        min_coverage: float = DEFAULT_MIN_COVERAGE,
    ) -> None:
        if not math.isfinite(gamma):
            raise ValueError(f"gamma must be finite, got {gamma}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        missing_r = [n for n in x_forget if n not in x_retain]
        missing_f = [n for n in x_retain if n not in x_forget]
        if missing_r or missing_f:
            raise ValueError(
                f"forget and retain activation norms cover different tensors: only forget {missing_r[:5]}, "
                f"only retain {missing_f[:5]}"
            )
        if not x_forget:
            raise ValueError("no activation norms given: nothing to score")
        self.gamma = float(gamma)
        self.eps = float(eps)
        self._ratio_f: dict[str, torch.Tensor] = {}
        self._ratio_r: dict[str, torch.Tensor] = {}
        for name in x_forget:
            xf = _as_vector(x_forget[name], name, "forget")
            xr = _as_vector(x_retain[name], name, "retain")
            if xf.shape != xr.shape:
                if xf.dim() == xr.dim() == 1:
                    raise ValueError(
                        f"tensor {name!r}: forget norms have {xf.numel()} channels, retain norms {xr.numel()}"
                    )
                raise ValueError(
                    f"tensor {name!r}: forget norms have shape {list(xf.shape)}, retain norms {list(xr.shape)}"
                )
            self._ratio_f[name] = xf / (xr + self.eps)
            self._ratio_r[name] = xr / (xf + self.eps)
        self._transposed = frozenset(conv1d_transposed)
        unknown = sorted(self._transposed - set(self._ratio_f))
        if unknown:
            raise ValueError(f"conv1d_transposed names without activation norms: {unknown[:5]}")
        self._sums: dict[str, list[float]] = {}
        self._rows: dict[str, int] = {}
        if coverage is None:
            coverage = getattr(x_forget, "coverage", None)
        self.coverage = coverage_verdict(dict(coverage), min_coverage) if coverage is not None else None

    @property
    def names(self) -> list[str]:
        """The scored weight names (those with activation norms), in the order given."""
        return list(self._ratio_f)

    @property
    def rows_seen(self) -> dict[str, int]:
        """Leading-dimension rows received so far per tensor (to check that every tensor was fed completely)."""
        return dict(self._rows)

    def input_dim(self, name: str) -> int:
        """d_in of ``name``, i.e. the length of its activation vectors."""
        return int(self._ratio(name)[0].shape[-1])

    def is_transposed(self, name: str) -> bool:
        """True for a ``(d_in, d_out)`` Conv1D weight, whose rows (not columns) are input channels."""
        return name in self._transposed

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Fail early, naming the tensor, if a full weight shape does not fit its activation vectors."""
        ratio_f, _ = self._ratio(name)
        experts = ratio_f.dim() == 2
        axis = (0 if name in self._transposed else 1) + int(experts)
        d_in = int(ratio_f.shape[-1])
        if len(shape) != 2 + int(experts) or shape[axis] != d_in or (experts and shape[0] != ratio_f.shape[0]):
            layout = ("[E, d_in, d_out]" if experts else "(d_in, d_out) Conv1D") if name in self._transposed else ""
            layout = layout or ("[E, d_out, d_in]" if experts else "(d_out, d_in)")
            what = f"{ratio_f.shape[0]} experts, " if experts else ""
            raise ValueError(
                f"tensor {name!r} has shape {list(shape)}, but its {layout} layout should have {what}an input axis "
                f"of {d_in} channels (activation norms)"
            )

    def _ratio(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return self._ratio_f[name], self._ratio_r[name]
        except KeyError:
            raise ValueError(f"tensor {name!r} has no activation norms, so it cannot be scored by FRAG") from None

    def add(self, name: str, before_rows: torch.Tensor, after_rows: torch.Tensor, *, start: int | None = None) -> None:
        """Add a block of leading-dimension rows of W (``before_rows``) and W_unl (``after_rows``) of ``name``.

        Blocks of one tensor may come in several calls. ``start`` (the block's first row) matters only for
        transposed Conv1D weights, whose rows are input channels; by default it is the number of rows already seen.
        """
        ratio_f, ratio_r = self._ratio(name)
        before = torch.as_tensor(before_rows)
        after = torch.as_tensor(after_rows)
        if before.shape != after.shape:
            raise ValueError(f"tensor {name!r}: before block {list(before.shape)} vs after block {list(after.shape)}")
        if before.dim() != ratio_f.dim() + 1:
            raise ValueError(
                f"tensor {name!r}: expected a {ratio_f.dim() + 1}-D block of rows, got shape {list(before.shape)}"
            )
        seen = self._rows.get(name, 0)
        first = seen if start is None else int(start)
        rows = before.shape[0]
        if ratio_f.dim() == 2:
            self._add_experts(name, before, after, ratio_f, ratio_r, first)
            self._rows[name] = seen + rows
            return
        if name in self._transposed:
            if first < 0 or first + rows > ratio_f.numel():
                raise ValueError(
                    f"tensor {name!r} (Conv1D, rows are input channels): rows [{first}, {first + rows}) exceed "
                    f"its {ratio_f.numel()} activation channels"
                )
            ratio_f, ratio_r = ratio_f[first : first + rows], ratio_r[first : first + rows]
            reduce_dim = 1
        else:
            if before.shape[1] != ratio_f.numel():
                raise ValueError(
                    f"tensor {name!r} has {before.shape[1]} input columns, but its activation norms have "
                    f"{ratio_f.numel()} channels"
                )
            reduce_dim = 0
        w = before.to(torch.float64)
        d = (after.to(torch.float64) - w).square_()  # fresh tensor: in-place is safe
        a = w.abs()  # not abs_(): ``w`` may be the caller's float64 tensor
        ad = (a * d).sum(dim=reduce_dim)
        aa = a.square_().sum(dim=reduce_dim)
        sums = self._sums.setdefault(name, [0.0] * 5)
        sums[_FD] += float(ad @ ratio_f)
        sums[_RD] += float(ad @ ratio_r)
        sums[_FF] += float(aa @ ratio_f.square())
        sums[_RR] += float(aa @ ratio_r.square())
        sums[_DD] += float(d.square_().sum())
        self._rows[name] = seen + rows

    def _add_experts(
        self,
        name: str,
        before: torch.Tensor,
        after: torch.Tensor,
        ratio_f: torch.Tensor,
        ratio_r: torch.Tensor,
        first: int,
    ) -> None:
        """A block of experts ``[e0:e1]`` of a fused tensor: per expert, the 2-D sums with that expert's x."""
        rows = before.shape[0]
        if first < 0 or first + rows > ratio_f.shape[0]:
            raise ValueError(
                f"tensor {name!r} (fused experts): experts [{first}, {first + rows}) exceed its {ratio_f.shape[0]} "
                f"activation rows"
            )
        axis = 1 if name in self._transposed else 2  # the input axis of the [E, ., .] block
        if before.shape[axis] != ratio_f.shape[1]:
            raise ValueError(
                f"tensor {name!r} has {before.shape[axis]} input channels per expert, but its activation norms have "
                f"{ratio_f.shape[1]}"
            )
        ratio_f, ratio_r = ratio_f[first : first + rows], ratio_r[first : first + rows]
        reduce_dim = 2 if axis == 1 else 1  # sum over the output axis, keep [experts, d_in]
        w = before.to(torch.float64)
        d = (after.to(torch.float64) - w).square_()
        a = w.abs()
        ad = (a * d).sum(dim=reduce_dim)
        aa = a.square_().sum(dim=reduce_dim)
        sums = self._sums.setdefault(name, [0.0] * 5)
        sums[_FD] += float((ad * ratio_f).sum())
        sums[_RD] += float((ad * ratio_r).sum())
        sums[_FF] += float((aa * ratio_f.square()).sum())
        sums[_RR] += float((aa * ratio_r.square()).sum())
        sums[_DD] += float(d.square_().sum())

    def result(self) -> dict[str, Any]:
        """Global A_f, A_r and FRAG = A_f - gamma * A_r over every tensor added, plus the same per module."""
        if not self._sums:
            raise ValueError("FRAG: no tensors were added, nothing to score")
        total = [0.0] * 5
        per_module: dict[str, dict[str, float]] = {}
        for name, s in self._sums.items():
            for k in range(5):
                total[k] += s[k]
            af, ar = _cosine(s[_FD], s[_FF], s[_DD]), _cosine(s[_RD], s[_RR], s[_DD])
            per_module[name] = {"forget_alignment": af, "retain_alignment": ar, "frag": af - self.gamma * ar}
        af, ar = _cosine(total[_FD], total[_FF], total[_DD]), _cosine(total[_RD], total[_RR], total[_DD])
        return {
            "forget_alignment": af,
            "retain_alignment": ar,
            "frag": af - self.gamma * ar,
            "gamma": self.gamma,
            "eps": self.eps,
            "modules": len(self._sums),
            "per_module": per_module,
            **({"coverage": self.coverage} if self.coverage is not None else {}),
        }


def _as_vector(x: Any, name: str, side: str) -> torch.Tensor:
    """A 1-D vector (d_in), or ``[E, d_in]`` for fused experts, as float64 on the CPU."""
    v = torch.as_tensor(x).detach().to(torch.float64).cpu()
    if v.dim() not in (1, 2) or v.numel() == 0:
        raise ValueError(
            f"{side} activation norms of {name!r}: expected a non-empty 1-D vector (or [experts, d_in]), "
            f"got {list(v.shape)}"
        )
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise ValueError(f"{side} activation norms of {name!r} contain negative, NaN or inf values")
    return v


def frag_score(
    before: Checkpoint,
    after: Checkpoint,
    stats: ActivationStats,
    gamma: float = 1.0,
    block_elems: int = 4_000_000,
    eps: float = 1e-6,
) -> dict[str, Any]:
    """FRAG of ``after`` (unlearned) against ``before`` (original), streamed block by block
    (docs/definitions.md#frag-score).

    Scores exactly the tensors that have activation norms in ``stats`` (from the original model); both checkpoints
    must hold them with equal shapes. ``block_elems`` bounds the scalars read per block. Streamed by
    :func:`~lacuna_metrics.weights.pair_walk.walk_pair`; ``lacuna score`` feeds a :class:`FragAccumulator` from its own walk.
    """
    if block_elems < 1:
        raise ValueError(f"block_elems must be >= 1, got {block_elems}")
    acc = FragAccumulator(
        stats.forget,
        stats.retain,
        gamma=gamma,
        eps=eps,
        conv1d_transposed=stats.conv1d_transposed,
        coverage=stats.coverage,
    )
    names = check_compatible({"before": before, "after": after}, names=acc.names)
    for name in names:
        acc.check_shape(name, before.shape(name))
    walk_pair(before, after, names, [acc.add], block_elems=block_elems, desc="FRAG")
    return acc.result()
