"""Wall time, peak RSS and memorization of a testbed build (`lacuna build-testbed --preset P`).

    python benchmarks/bench_testbed.py [--preset smoke|mini] [--out DIR]

Runs the real CLI in a child process, reads its peak RSS (getrusage of children) and the manifest, and
prints per-stage seconds, the share of each stage in the total, and memorization per field (share of forget /
retain people extractable by greedy QA). The masked/unmasked step-time ratio is `bench_masking.py`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_testbed_")) / args.preset
    lacuna = Path(sys.executable).with_name("lacuna")
    start = time.perf_counter()
    cmd = [str(lacuna), "build-testbed", "--preset", args.preset, "--out", str(out), "--force"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
    manifest = json.loads((out / "manifest.json").read_text())
    timings = manifest["timings_seconds"]
    print(f"preset {args.preset}: wall {wall:.1f} s (process), peak RSS {peak_gb:.2f} GB, out {out}")
    print(f"| {'stage':<20} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 22}|{'-' * 10}|{'-' * 8}|")
    for stage, seconds in timings.items():
        if stage != "total":
            print(f"| {stage:<20} | {seconds:8.1f} | {seconds / timings['total']:6.2f} |")
    print("\nmemorization (extractable forget / retain, eligible forget / retain):")
    for field, row in manifest["memorization"].items():
        if isinstance(row, dict) and "forget" in row:
            f, r = row["forget"], row["retain"]
            print(
                f"  {field:<16} {f['extractable']:.2f} / {r['extractable']:.2f}   {f['eligible']:.2f} / {r['eligible']:.2f}"
            )
    print("trivial detectors:", json.dumps(manifest["trivial_detector_auc"]))


if __name__ == "__main__":
    main()
