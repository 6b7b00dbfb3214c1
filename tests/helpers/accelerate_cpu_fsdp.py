"""Run a module under accelerate's FSDP code path on CPU processes (test helper, not a test).

accelerate 1.15 never enables FSDP on a CPU-only host, although torch 2.13 can shard there (FSDP2
``fully_shard`` on a gloo CPU mesh; FSDP1 with ``device_id=cpu``). Measured, with
``accelerate launch --use_fsdp --num_processes 2``:

* ``FullyShardedDataParallelPlugin.__post_init__`` raises ``RuntimeError: There are currently no available
  devices found, must be one of 'XPU', 'CUDA', 'MLU', 'NPU', 'MUSA', or 'HPU'.`` while ``sync_module_states``
  is on (the launcher's default);
* with ``--fsdp_sync_module_states false --fsdp_cpu_ram_efficient_loading false``, ``AcceleratorState`` only
  switches to ``DistributedType.FSDP`` from a GPU-like multi-device type, so a ``use_cpu`` run stays
  ``MULTI_CPU`` and the model is wrapped in DDP: the FSDP plugin is dropped without a word.

This wrapper does only the switch accelerate refuses (``MULTI_CPU`` + an FSDP plugin -> ``FSDP``) and then
runs the module unchanged, so the Trainer, accelerate's ``fsdp2_prepare_model`` / FSDP1 wrapping, the
sharded optimizer and the full-state-dict save all run as on GPUs, with gloo on CPU.

Usage: ``accelerate launch --use_fsdp --fsdp_version 2 --fsdp_sync_module_states false
--fsdp_cpu_ram_efficient_loading false --num_processes 2 tests/helpers/accelerate_cpu_fsdp.py -m MODULE ARGS...``.
"""

from __future__ import annotations

import runpy
import sys


def enable_cpu_fsdp() -> None:
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            # as accelerate itself does for FSDP: later AcceleratorState() calls copy PartialState's type
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = __init__


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        raise SystemExit("usage: accelerate_cpu_fsdp.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    enable_cpu_fsdp()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
