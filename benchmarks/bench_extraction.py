"""Extraction probe speed (docs/definitions.md#extraction-probe-and-leak-rate): `lacuna_<field>_extraction` through
lm-eval, batched vs batch 1.

    python benchmarks/bench_extraction.py --testbed runs/mini --attempts 200

Runs the probe on the testbed's model with lm-eval's Python API at ``--batch-size`` and, as the same-run
baseline, at batch size 1 on a slice of the attempts (``--baseline-attempts``), then prints generations per
second and the ratio. Every configuration runs in a fresh process so model loading and caches do not leak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, sys, time
from lacuna_tasks.harness.evaluate import evaluate
model, data, field, attempts, batch = sys.argv[1:6]
t = time.perf_counter()
out = evaluate(model, [f"lacuna_{field}_extraction"], data=data, metadata={"extraction_attempts": int(attempts)},
               batch_size=int(batch))
wall = time.perf_counter() - t
task = out["results"][f"lacuna_{field}_extraction"]
print(json.dumps({"wall": wall, "generations": len(out["samples"][f"lacuna_{field}_extraction"]), **task}))
"""


def child(model: Path, data: Path, field: str, attempts: int, batch: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(data), field, str(attempts), str(batch)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--testbed", required=True, type=Path)
    parser.add_argument("--model", type=Path, help="checkpoint to probe (default: TESTBED/model)")
    parser.add_argument("--field", default="email")
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--baseline-attempts", type=int, default=10)
    args = parser.parse_args()
    model, data = args.model or args.testbed / "model", args.testbed / "data"
    started = time.time()
    fast = child(model, data, args.field, args.attempts, args.batch_size)
    base = child(model, data, args.field, args.baseline_attempts, 1)
    fast_rate, base_rate = fast["generations"] / fast["wall"], base["generations"] / base["wall"]
    print("| run | generations | seconds | generations/s | Success@N | ratio vs batch 1 |")
    print("|---|---|---|---|---|---|")
    print(
        f"| batch {args.batch_size}, N = {args.attempts} | {fast['generations']} | {fast['wall']:.1f} "
        f"| {fast_rate:.1f} | {fast['success_at_n']:.3f} | {fast_rate / base_rate:.1f}x |"
    )
    print(
        f"| batch 1, N = {args.baseline_attempts} (baseline) | {base['generations']} | {base['wall']:.1f} "
        f"| {base_rate:.1f} | {base['success_at_n']:.3f} | 1.0x |"
    )
    print(f"total {time.time() - started:.0f} s (each wall includes model loading and lm-eval task setup)")


if __name__ == "__main__":
    main()
