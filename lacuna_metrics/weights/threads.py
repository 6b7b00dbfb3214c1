"""One decision on CPU threads per process: ``OMP_NUM_THREADS`` when the user set it, else a measured default.

torch sizes its intra-op pool from the cores it sees, and BLAS/OpenMP pools (numpy, sklearn) do the same, so two
processes on a 2-core machine each run two threads and slow one another down. Every console entry point calls
:func:`configure_threads` once, before any heavy import. The default is every core: on an idle 2-core machine the
smoke testbed builds in 135 s with both cores against 232 s with one (``python benchmarks/bench_threads.py``,
docs/distributed.md "Threads"); set ``OMP_NUM_THREADS=1`` when several jobs share the machine.
"""

from __future__ import annotations

import os
import sys

__all__ = ["DEFAULT_THREADS", "configure_threads"]

#: Threads when ``OMP_NUM_THREADS`` is unset: ``None`` = every core torch sees (measured faster than 1 when idle).
DEFAULT_THREADS: int | None = None


def configure_threads(default: int | None = DEFAULT_THREADS) -> int | None:
    """Apply ``OMP_NUM_THREADS`` (if set) or ``default`` to torch and the OpenMP/BLAS pools; return the count in
    force (``None``: the libraries' own choice, every core). Cheap: sets the environment before torch and numpy
    start their pools, and calls ``torch.set_num_threads`` only if torch is already imported. A malformed
    variable is an error naming it, not a silent fallback."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"OMP_NUM_THREADS={raw!r}: expected a positive integer")
        wanted: int | None = int(raw)
    else:
        wanted = default
    if wanted is None:
        return None
    os.environ["OMP_NUM_THREADS"] = str(wanted)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return wanted
