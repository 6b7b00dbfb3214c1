"""The universe of the localization scorer (docs/definitions.md#localization-precision): which tensors are scored,
how they are grouped, and one block of every source read for them.

The universe is the masked attention/MLP tensors with at least one forget scalar and one other scalar, known from
the masks alone before scoring. Tensors are walked in file order, masked ones grouped by (layer, component); a block
of the universe is read from every source (before, after, reference, control, crossfield runs) with its mask, and
one compiled pass (:func:`~lacuna_metrics.kernels.pair_pass`) gives its categories, |δ|, |θ_before| and sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from lacuna_metrics.kernels import pair_pass
from lacuna_metrics.localization.group_stats import group_key
from lacuna_metrics.masks import MaskError, MaskReader, component
from lacuna_metrics.weights.checkpoints import Checkpoint, CheckpointError, Scratch
from lacuna_metrics.weights.pair_walk import Block

__all__ = ["Universe"]

_PAIR = ("before", "after")


class Universe:
    """The scored tensors of ``before`` under ``masks`` (``candidates``: masked attention/MLP tensors; ``members``:
    those with forget and other scalars) and the reads of their blocks from every source."""

    def __init__(
        self,
        before: Checkpoint,
        after: Checkpoint,
        masks: MaskReader,
        *,
        base: Checkpoint | None = None,
        control: tuple[Checkpoint, Checkpoint] | None = None,
        crossfield: Sequence[Checkpoint] = (),
        block_elems: int = 1 << 20,
    ) -> None:
        self.before, self.after, self.masks, self.base, self.control = before, after, masks, base, control
        self.crossfield, self.block_elems = list(crossfield), block_elems
        self.candidates = self._find_candidates()
        self.members = self._find_universe()

    def _find_candidates(self) -> set[str]:
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
            for start, stop in self.before.iter_blocks(name, self.block_elems):
                packed = self.masks.read(name, shape, start, stop)
                hits = int(((packed & self.masks.forget_bits) != 0).sum())
                forget, other = forget + hits, other + packed.numel() - hits
                if forget and other:  # usually decided by the first block
                    members.add(name)
                    break
        if not members:
            raise MaskError(f"{self.masks.path}: no tensor has both forget and non-forget scalars; nothing to score")
        return members

    def units(self, one_pass: bool) -> list[tuple[tuple[int, str] | None, list[str]]]:
        """Tensors in file order, masked ones grouped by (layer, component); when a score needs σ, an unmasked
        attention/MLP tensor joins its (layer, component) group if the group has a masked one (σ is over every
        tensor of the group)."""
        units: list[tuple[tuple[int, str] | None, list[str]]] = []
        index: dict[tuple[int, str], int] = {}
        keys = set() if one_pass else {group_key(n) for n in self.candidates}
        for name in self.before.names:
            if self.before.is_alias(name):
                continue
            if name in self.candidates or (component(name) is not None and group_key(name) in keys):
                key = group_key(name)
                if key not in index:
                    index[key] = len(units)
                    units.append((key, []))
                units[index[key]][1].append(name)
            else:
                units.append((None, [name]))
        return units

    def sources(self, universe: bool) -> dict[str, Checkpoint]:
        out = {"before": self.before, "after": self.after}
        if universe:
            if self.base is not None:
                out["base"] = self.base
            if self.control is not None:
                out["control_before"], out["control_after"] = self.control
            for i, ckpt in enumerate(self.crossfield):
                out[f"crossfield{i}"] = ckpt
        return out

    def read(self, blk: Block, universe: bool, scratch: Scratch) -> dict[str, torch.Tensor]:
        """Read one block of every source; in the universe also its mask and :meth:`_pair_pass`'s outputs.

        An unmasked tensor of a group (read for the group's σs only) gets an all-zero mask and no reference or
        crossfield reads: it needs δ and the contrast, nothing else."""
        masked = blk.name in self.candidates
        sources = self.sources(universe)
        if universe and not masked:
            sources = {k: v for k, v in sources.items() if k in ("before", "after", "control_before", "control_after")}
        b: dict[str, torch.Tensor] = {}
        for label, ck in sources.items():
            # in the universe the pair's NaN/inf check is part of the pair pass
            check = not universe or label not in _PAIR
            stored, b[label] = ck.read_stored(blk.name, blk.start, blk.stop, check_finite=check, scratch=scratch)
            if label in _PAIR:  # as stored: for PairWalk.stream_fingerprints
                b[f"{label}_stored"] = stored
        if universe:
            if masked:
                b["mask"] = self.masks.read(blk.name, self.before.shape(blk.name), blk.start, blk.stop, scratch=scratch)
            else:
                b["mask"] = scratch.take("unmasked", torch.uint8, b["before"].numel()).zero_()
            self._pair_pass(blk, b, scratch)
        return b

    def _pair_pass(self, blk: Block, b: dict[str, torch.Tensor], scratch: Scratch) -> None:
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
                file = self.sources(False)[label].info(blk.name).file
                raise CheckpointError(
                    f"{file}: tensor {blk.name!r} contains {int(bad)} NaN/inf values (rows {blk.start}-{blk.stop})"
                )
        b.update(delta=delta, before_abs=before_abs, cats=cats, sums=sums)
