"""One ordered walk over a before/after checkpoint pair, shared by every consumer of ``lacuna score``.

The walk cuts tensors into row blocks (:meth:`Checkpoint.iter_blocks`), numbers them in file order, and runs them on
worker threads: each worker reads a block of every source and does the consumer's work on it, while the pair hooks
(:meth:`PairWalk.add_hook`: distances, FRAG) and the progress updates run one block at a time in block order (a
turnstile), because they add float sums whose rounding depends on the order. So each tensor pair is read once,
streamed block by block (never two whole models in memory), and no number depends on the thread count.

Localization (:class:`lacuna_metrics.localization.Localization`) drives the walk group by group with its own reads
(masks, reference checkpoints) and work; without masks :meth:`PairWalk.run` walks the pair for the hooks alone.
"""

from __future__ import annotations

import gc
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lacuna_metrics.checkpoints import Checkpoint, Scratch
from lacuna_tasks.logs import progress as progress_bar

__all__ = ["DEFAULT_THREADS", "Block", "PairHook", "PairWalk", "walk_pair"]

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
        self.pool: ThreadPoolExecutor | None = None  # set inside session()
        self._seq = 0  # blocks planned so far: the turnstile's order
        self._abort = False  # set when a block failed: the blocks still in flight skip their work
        self._turnstile = _Turnstile()
        self._thread_state = threading.local()

    def add_hook(self, hook: PairHook) -> None:
        """Call ``hook(name, before_block, after_block)`` for every block of the walk, in file order."""
        self.hooks.append(hook)

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
        return {
            "before": self.before.read(blk.name, blk.start, blk.stop, scratch=scratch),
            "after": self.after.read(blk.name, blk.start, blk.stop, scratch=scratch),
        }

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
                b = read(blk)
        finally:
            with self._turnstile.turn(blk.seq):  # always taken, so later blocks never wait for a failed one
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
    standalone walk: one consumer outside ``lacuna score``, e.g. :func:`~lacuna_metrics.frag.frag_score`)."""
    walk = PairWalk(before, after, block_elems=block_elems, threads=threads)
    for hook in hooks:
        walk.add_hook(hook)
    total = sum(before.info(n).numel for n in names)
    with progress_bar(total=total, unit="param", unit_scale=True, desc=desc, leave=False) as bar:
        walk.add_progress(bar.update)
        walk.run(names)
