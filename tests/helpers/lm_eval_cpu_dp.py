"""``lm_eval`` with its data-parallel split switched on for CPU processes (test helper, not a test).

lm-eval 0.4.13's ``HFLM`` shards the documents across ``accelerate launch`` processes only when
``torch.cuda.device_count() > 1`` (``models/huggingface.py``: ``elif gpus > 1:``); on a CPU-only host
every process keeps ``rank=0, world_size=1`` and evaluates all documents (replicated, not split).
This wrapper sets ``rank``/``world_size`` from the accelerator after ``HFLM.__init__`` and then runs
the unmodified ``lm_eval`` CLI, so that a 2-process gloo run goes through exactly the GPU code path:
``build_all_requests(rank, world_size)`` (documents interleaved across ranks), padding, and
``gather_object`` of every per-document metric to rank 0 before aggregation.

Usage (CPU): ``ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 tests/helpers/lm_eval_cpu_dp.py
<lm_eval arguments>``.
"""

from __future__ import annotations

import os
import sys


def enable_cpu_data_parallel() -> None:
    from lm_eval.models.huggingface import HFLM

    original = HFLM.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1 and self._world_size == 1:
            self._rank = accelerator.process_index
            self._world_size = accelerator.num_processes
            print(f"lm_eval_cpu_dp: rank {self._rank} of {self._world_size}", file=sys.stderr, flush=True)

    HFLM.__init__ = __init__


if __name__ == "__main__":
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        enable_cpu_data_parallel()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
