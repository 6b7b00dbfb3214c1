"""One ordered walk over a before/after checkpoint pair, shared by every consumer of ``lacuna score``.

The walk cuts tensors into row blocks (:meth:`Checkpoint.iter_blocks`), numbers them in file order, and runs them on
worker threads: each worker reads a block of every source and does the consumer's work on it, while the pair hooks
(:meth:`PairWalk.add_hook`: distances, FRAG) and the progress updates run one block at a time in block order (a
turnstile), because they add float sums whose rounding depends on the order. So each tensor pair is read once,
streamed block by block (never two whole models in memory), and no number depends on the thread count.

Localization (:class:`lacuna_metrics.localization.precision.Localization`) drives the walk group by group with its own reads
(masks, reference checkpoints) and work; without masks :meth:`PairWalk.run` walks the pair for the hooks alone.
"""

from __future__ import annotations

import gc
import hashlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from lacuna_metrics.weights.checkpoints import Checkpoint, Scratch, fingerprint_of, tensor_digest
from lacuna_tasks import progress as progress_bar

__all__ = ["DEFAULT_THREADS", "Block", "PairHook", "PairWalk", "StreamedFingerprint", "walk_pair"]

#: Worker threads of the walk, each reading and scoring whole blocks.
DEFAULT_THREADS = max(1, min(4, os.cpu_count() or 1))

#: ``hook(name, before_block, after_block)``: called once per block in file order; the blocks are reused buffers,
#: valid only during the call (copy what must outlive it).
PairHook = Callable[[str, torch.Tensor, torch.Tensor], None]
Blocks = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Block:
    """Rows ``[start, stop)`` of tensor ``name`` (flat scalars ``[lo, hi)``), the ``seq``-th block of the walk."""

    seq: int
    name: str
    start: int
    stop: int
    lo: int
    hi: int


class _Turnstile:
    """Lets worker threads run a step one block at a time in block order (the hooks add float sums, whose rounding
    depends on the order)."""

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
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``n`` (restored afterwards; None: unchanged)."""
    before = torch.get_num_threads()
    if n is not None:
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


class StreamedFingerprint:
    """``Checkpoint.fingerprint()`` from the blocks a walk reads anyway, so hashing costs no read of its own.

    Feed every block of a tensor in row order (:meth:`update`; :class:`PairWalk` does, a turnstile per
    checkpoint). A tensor whose blocks were not all seen in order is hashed from its file by :meth:`finish`.
    The result is the same string as ``Checkpoint.fingerprint()``: the per-tensor digests are SHA-256 of the
    same bytes (docs/ci.md, the fingerprint).
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self._hashes: dict[str, Any] = {}
        self._next_row: dict[str, int] = {}
        self._broken: set[str] = set()

    def update(self, name: str, start: int, stop: int, stored: torch.Tensor) -> None:
        """Hash rows ``[start, stop)`` of ``name`` (``stored``: as ``Checkpoint.read_stored`` returns them)."""
        if name in self._broken or self.ckpt.is_alias(name):
            return
        if self._next_row.get(name, 0) != start:  # a gap or a repeat: hash this tensor from its file instead
            self._broken.add(name)
            return
        digest = self._hashes.get(name)
        if digest is None:
            digest = self._hashes[name] = hashlib.sha256()
        digest.update(stored.contiguous().reshape(-1).view(torch.uint8).numpy())
        self._next_row[name] = stop

    def finish(self) -> str:
        """The checkpoint's fingerprint, also cached on it (later ``fingerprint()`` calls hash nothing)."""
        ckpt = self.ckpt
        if ckpt._fingerprint is None:  # the checkpoint's own cache (pair_walk and checkpoints share the scheme)
            digests = {}
            for info in (ckpt.info(n) for n in ckpt.names if not ckpt.is_alias(n)):
                done = info.name not in self._broken and self._next_row.get(info.name, 0) == info.rows
                if done and info.rows:
                    digests[info.name] = self._hashes[info.name].hexdigest()
                else:
                    digests[info.name] = tensor_digest(ckpt, info)
            ckpt._fingerprint = fingerprint_of(ckpt, digests)
        return ckpt._fingerprint


class PairWalk:
    """The blocks of ``before``/``after`` in file order, on ``threads`` workers; see the module docstring."""

    def __init__(
        self, before: Checkpoint, after: Checkpoint, *, block_elems: int = 1 << 20, threads: int = DEFAULT_THREADS
    ) -> None:
        if block_elems < 1:
            raise ValueError(f"block_elems must be >= 1, got {block_elems}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.before, self.after, self.block_elems, self.threads = before, after, block_elems, threads
        self.hooks: list[PairHook] = []
        self.progress: list[Callable[[int], None]] = []
        self.guards: list[Callable[[], None]] = []
        self.pool: ThreadPoolExecutor | None = None  # set inside session()
        self._seq = 0  # blocks planned so far: the turnstile's order
        self._abort = False  # set when a block failed: the blocks still in flight skip their work
        self._turnstile = _Turnstile()
        self._thread_state = threading.local()
        self._fingerprints: dict[str, StreamedFingerprint] = {}
        self._hash_turnstiles: dict[str, _Turnstile] = {}  # one per hashed checkpoint: the two hash side by side

    def stream_fingerprints(self, labels: Sequence[str] = ("before", "after")) -> None:
        """Hash the tensors of ``labels`` (``before``/``after``) from the walk's own reads, each block in file order
        (a turnstile per checkpoint): their :meth:`fingerprint` then costs no pass over the files of its own. The
        readers must put each block as stored under ``"<label>_stored"`` (:meth:`read_pair` does)."""
        if self._seq:  # a turnstile counts blocks from the walk's first
            raise RuntimeError("PairWalk.stream_fingerprints() must be called before any block is planned")
        for label in labels:
            self._fingerprints[label] = StreamedFingerprint(getattr(self, label))
            self._hash_turnstiles[label] = _Turnstile()

    @property
    def streamed(self) -> tuple[str, ...]:
        """The labels whose fingerprints this walk hashes (:meth:`stream_fingerprints`)."""
        return tuple(self._fingerprints)

    def fingerprint(self, label: str) -> str:
        """The fingerprint of ``before`` or ``after``: streamed when :meth:`stream_fingerprints` asked for it
        (call after the walk), else hashed from the files."""
        streamed = self._fingerprints.get(label)
        return streamed.finish() if streamed is not None else getattr(self, label).fingerprint()

    def add_hook(self, hook: PairHook) -> None:
        """Call ``hook(name, before_block, after_block)`` for every block of the walk, in file order."""
        self.hooks.append(hook)

    def add_guard(self, check: Callable[[], None]) -> None:
        """Call ``check()`` before every block's read: an error it raises fails the block, and so stops the walk,
        as a read error would (e.g. a check running beside the walk, :meth:`MaskReader.verify_in_background`)."""
        self.guards.append(check)

    def add_progress(self, update: Callable[[int], None]) -> None:
        """Call ``update(scalars)`` after every block's hooks."""
        self.progress.append(update)

    @contextmanager
    def session(self) -> Iterator[ThreadPoolExecutor]:
        """The worker pool of the walk (consumers may submit their own tasks to it)."""
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="lacuna-auc") as pool:
            self.pool = pool
            try:
                yield pool
            finally:
                self.pool = None

    @contextmanager
    def walking(self, torch_threads: int | None = None) -> Iterator[None]:
        """Around the walk's passes: torch's intra-op threads set to ``torch_threads`` (idle OpenMP workers would
        spin while the walk parallelises by itself) and the garbage collector's old objects frozen."""
        with _torch_threads(torch_threads), _gc_frozen():
            yield

    def run(self, names: Sequence[str] | None = None) -> None:
        """Walk ``names`` (default: every tensor of ``before`` but tied aliases) for the hooks alone."""
        if names is None:
            names = [n for n in self.before.names if not self.before.is_alias(n)]
        with self.session(), self.walking():
            self.run_blocks(self.plan(names), self.read_pair, None, hooks=True)

    def plan(self, names: Sequence[str]) -> list[Block]:
        """The blocks of ``names`` in file order, numbered for the turnstile."""
        blocks = []
        for name in names:
            shape = self.before.shape(name)
            row = math.prod(shape[1:]) if len(shape) > 1 else 1
            for start, stop in self.before.iter_blocks(name, self.block_elems):
                blocks.append(Block(self._seq, name, start, stop, start * row, stop * row))
                self._seq += 1
        return blocks

    def scratch(self) -> Scratch:
        """This worker thread's block buffers (a block is finished before its thread reads the next)."""
        scratch = getattr(self._thread_state, "scratch", None)
        if scratch is None:
            scratch = self._thread_state.scratch = Scratch()
        return scratch

    def read_pair(self, blk: Block) -> Blocks:
        """One block of ``before`` and ``after`` (NaN/inf checked) into this thread's buffers."""
        scratch = self.scratch()
        b: Blocks = {}
        for label in ("before", "after"):
            ckpt = getattr(self, label)
            b[f"{label}_stored"], b[label] = ckpt.read_stored(blk.name, blk.start, blk.stop, scratch=scratch)
        return b

    def run_blocks(
        self,
        blocks: Sequence[Block],
        read: Callable[[Block], Blocks],
        work: Callable[[Block, Blocks], None] | None,
        *,
        hooks: bool,
    ) -> None:
        """Process ``blocks`` on the workers: ``read`` then, in block order, the hooks (when ``hooks``), then
        ``work`` (in any order). Needs :meth:`session`.

        At most ``threads + 1`` blocks are read or worked on at once (bounds the memory). A failed block stops the
        walk: the blocks in flight skip their work, and the first failure in file order is raised, as a sequential
        read would.
        """
        assert self.pool is not None, "run_blocks needs PairWalk.session()"
        inflight: list[tuple[int, Future[None]]] = []
        failed: list[tuple[int, BaseException]] = []

        def settle(futures: list[tuple[int, Future[None]]]) -> None:
            for seq, future in futures:
                if (exc := future.exception()) is not None:  # waits for the block
                    failed.append((seq, exc))
                    self._abort = True

        limit = self.threads + 1
        try:
            for blk in blocks:
                while len(inflight) >= limit and not failed:
                    done, _ = wait([f for _, f in inflight], return_when=FIRST_COMPLETED)
                    settle([(seq, f) for seq, f in inflight if f in done])
                    inflight = [(seq, f) for seq, f in inflight if f not in done]
                if failed:
                    break
                inflight.append((blk.seq, self.pool.submit(self._block_task, blk, read, work, hooks)))
        finally:
            self._abort = self._abort or bool(failed)
            settle(inflight)  # never cancel: a later block may be waiting for an earlier one's turn
            self._abort = False
        if failed:
            raise min(failed, key=lambda f: f[0])[1]

    def _block_task(
        self, blk: Block, read: Callable[[Block], Blocks], work: Callable[[Block, Blocks], None] | None, hooks: bool
    ) -> None:
        b: Blocks | None = None
        try:
            if not self._abort:
                for check in self.guards:
                    check()
                b = read(blk)
        finally:
            # every turnstile is always taken, so later blocks never wait for a failed one; each checkpoint's
            # fingerprint has a turnstile of its own (a tensor's blocks are hashed in order), so the hashing of
            # one block's before, of another's after and the hooks run side by side
            for label, streamed in self._fingerprints.items():
                with self._hash_turnstiles[label].turn(blk.seq):
                    if b is not None and hooks and not self._abort:
                        streamed.update(blk.name, blk.start, blk.stop, b[f"{label}_stored"])
            with self._turnstile.turn(blk.seq):
                if b is not None and hooks and not self._abort:
                    for hook in self.hooks:
                        hook(blk.name, b["before"], b["after"])
                    for update in self.progress:
                        update(b["before"].numel())
        if b is not None and not self._abort and work is not None:
            work(blk, b)


def walk_pair(
    before: Checkpoint,
    after: Checkpoint,
    names: Sequence[str],
    hooks: Sequence[PairHook],
    *,
    block_elems: int,
    desc: str,
    threads: int = DEFAULT_THREADS,
) -> None:
    """Feed every block of ``names`` of the pair to ``hooks`` in file order, with a progress bar ``desc`` (a
    standalone walk: one consumer outside ``lacuna score``, e.g. :func:`~lacuna_metrics.frag.alignment.frag_score`)."""
    walk = PairWalk(before, after, block_elems=block_elems, threads=threads)
    for hook in hooks:
        walk.add_hook(hook)
    total = sum(before.info(n).numel for n in names)
    with progress_bar(total=total, unit="param", unit_scale=True, desc=desc, leave=False) as bar:
        walk.add_progress(bar.update)
        walk.run(names)
