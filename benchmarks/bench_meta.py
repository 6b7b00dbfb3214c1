"""Wall time and peak RSS of `lacuna meta` against the `lacuna run` whose pool it reads, measured in the same run.

    python benchmarks/bench_meta.py --testbed DIR [--preset smoke|mini] [--out DIR] [--threads N]

Runs the meta preset's `lacuna run` (baseline) into a fresh run directory in a child process, then `lacuna meta` on
it, cold, in another, each under a wrapper that reports its own peak RSS (getrusage of its children). Prints the
pool's size and one row per phase: wall seconds, peak RSS, and the ratio of each to the run's. A third phase reruns
`lacuna meta` over the cache (the cost of a report-only change). ``--testbed`` is the testbed the run reads (a built
testbed: the build is `bench_testbed.py`'s).
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

_WRAP = (
    "import resource, subprocess, sys; "
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)

_RUN = (
    "import sys; from lacuna_unlearn.bench.meta.run import load_meta_preset; "
    "from lacuna_unlearn.bench.run import run_benchmark; "
    "cfg, _ = load_meta_preset(sys.argv[1], {'testbed': sys.argv[2]}); run_benchmark(sys.argv[3], cfg)"
)


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in GB) of ``cmd`` run to completion in a wrapper process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _WRAP, *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_meta: {' '.join(cmd[:4])} ... failed (exit {proc.returncode})")
    return wall, int(proc.stdout.strip().splitlines()[-1]) / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testbed", required=True, help="a built testbed (lacuna build-testbed)")
    parser.add_argument("--preset", default="smoke", help="meta preset (lacuna_unlearn/presets/meta/)")
    parser.add_argument("--out", default=None, help="where the run directory goes (default: a temp directory)")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of both phases (default: inherit)")
    args = parser.parse_args()
    run_dir = Path(args.out or tempfile.mkdtemp(prefix="bench_meta_")) / "run"
    if run_dir.exists():
        sys.exit(f"bench_meta: {run_dir} exists: give a fresh --out (the meta phase must run cold)")
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    lacuna = str(Path(sys.executable).with_name("lacuna"))
    rows = [
        ("lacuna run (baseline)", _timed([sys.executable, "-c", _RUN, args.preset, args.testbed, str(run_dir)], env)),
        ("lacuna meta, cold", _timed([lacuna, "meta", str(run_dir)], env)),
        ("lacuna meta, cached", _timed([lacuna, "meta", str(run_dir)], env)),
    ]
    meta = json.loads((run_dir / "meta" / "meta.json").read_text())
    pool = meta["pool"]
    print(
        f"meta preset {args.preset}, testbed {args.testbed}, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}: "
        f"pool of {pool['models']} models ({len(pool['noise_controls'])} noise controls), run {run_dir}"
    )
    print("| phase | wall s | peak RSS GB | wall / run | RSS / run |")
    print("|---|---|---|---|---|")
    base_wall, base_rss = rows[0][1]
    for name, (wall, rss) in rows:
        print(f"| {name} | {wall:.1f} | {rss:.2f} | {wall / base_wall:.2f} | {rss / base_rss:.2f} |")


if __name__ == "__main__":
    main()
