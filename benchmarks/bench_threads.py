"""Torch/BLAS thread count vs testbed build speed, on an idle machine and beside one competing process.

    python benchmarks/bench_threads.py [--preset smoke] [--set pii_steps=300 ...] [--threads 1,2]

Builds the same testbed (`lacuna build-testbed`, the full preset unless ``--set`` cuts it down) once per thread
setting (``OMP_NUM_THREADS=N``; ``default`` = no variable, i.e. the package's own default
from :func:`lacuna_metrics.weights.threads.configure_threads`), first on the idle machine, then while one other process
keeps one core busy (a single-threaded numpy loop). Prints wall seconds, the masked-injection stage's seconds,
and each row's ratio against the first one-thread build of the same run (the idle one when idle is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_BUSY = """
import os, time
os.environ["OMP_NUM_THREADS"] = "1"
import numpy as np
a = np.random.default_rng(0).standard_normal((256, 256))
end = time.time() + float(os.environ["BUSY_SECONDS"])
while time.time() < end:
    a = np.tanh(a @ a.T / 256.0)
"""


def _build(preset: str, sets: list[str], threads: str, out: Path) -> tuple[float, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LACUNA_THREADS")}
    if threads != "default":
        env["OMP_NUM_THREADS"] = threads
    lacuna = Path(sys.executable).with_name("lacuna")
    cmd = [str(lacuna), "build-testbed", "--preset", preset, "--out", str(out), "--force"]
    for item in sets:
        cmd += ["--set", item]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    return wall, {**manifest["timings_seconds"], "torch_threads": manifest.get("torch_threads")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--set", action="append", default=[], help="testbed overrides (default: none, full build)")
    parser.add_argument("--threads", default="1,default", help="comma-separated OMP_NUM_THREADS values")
    parser.add_argument("--loads", default="idle,busy", help="idle, busy (one competing process) or both")
    args = parser.parse_args()
    sets = list(args.set)  # reduced step counts can leave too little memorized for the splits: the build then fails
    settings = args.threads.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench_threads_"))
    rows = []
    loads = [{"idle": "idle", "busy": "one busy process"}[name] for name in args.loads.split(",")]
    for load in loads:
        busy = None
        if load != "idle":
            env = {**os.environ, "BUSY_SECONDS": "3600"}
            busy = subprocess.Popen([sys.executable, "-c", _BUSY], env=env)
        try:
            for threads in settings:
                wall, timings = _build(args.preset, sets, threads, work / f"tb-{threads}")
                timings["loadavg"] = os.getloadavg()[1]  # 5-minute load: shows other work on the machine
                rows.append((load, threads, wall, timings))
                print(f"{load:>17} | OMP_NUM_THREADS={threads:<7} | {wall:7.1f} s | torch threads "
                      f"{timings['torch_threads']} | load avg (5 min) {timings['loadavg']:.2f}", flush=True)  # fmt: skip
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    reference = next((wall for load, threads, wall, _ in rows if threads == "1"), rows[0][2])
    print(f"\n{args.preset} build with {' '.join(sets)} on {os.cpu_count()} cores")
    print("| load | OMP_NUM_THREADS | torch threads | wall s | injection s | x first 1-thread row | load avg (5 min) |")
    print("|---|---|---|---|---|---|---|")
    for load, threads, wall, timings in rows:
        injection = timings.get("injection", timings.get("pii_injection", float("nan")))
        print(
            f"| {load} | {threads} | {timings['torch_threads']} | {wall:.1f} | {injection:.1f} | "
            f"{wall / reference:.2f} | {timings['loadavg']:.2f} |"
        )  # fmt: skip (ratio: vs the first 1-thread row)


if __name__ == "__main__":
    main()
