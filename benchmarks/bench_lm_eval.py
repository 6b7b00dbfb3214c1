"""Wall time of ``lm_eval --tasks lacuna --limit 20`` on the demo model, and how much of it is lm-eval's
own task indexing (measured in the same run, as ratios of the CLI wall time).

    python benchmarks/bench_lm_eval.py [--limit 20] [--out runs/bench_lm_eval]

Rows: the full CLI run; a bare ``import lm_eval.tasks``; ``TaskManager()`` (index of every built-in task
plus ours, what the CLI builds on each call); ``TaskManager(include_defaults=False)`` (our tasks only, what
``lacuna_tasks.task_manager`` builds for the Python API).
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

INDEX_PROBE = """
import json, time
t0 = time.perf_counter()
from lm_eval.tasks import TaskManager
t1 = time.perf_counter()
tm = TaskManager(include_defaults={defaults})
t2 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "index": t2 - t1, "names": len(tm.all_tasks)}}))
"""


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--out", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' tiny memorizing LM
    from helpers.tiny_lm import build_demo

    work = Path(args.out or tempfile.mkdtemp(prefix="bench_lm_eval_"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    t = time.perf_counter()
    info = build_demo(work / "demo")
    build_s = time.perf_counter() - t

    lm_eval = Path(sys.executable).with_name("lm_eval")
    cli = [
        str(lm_eval),
        "--model", "hf",
        "--model_args", f"pretrained={info['model']},dtype=float32",
        "--tasks", "lacuna",
        "--limit", str(args.limit),
        "--metadata", json.dumps({"lacuna_data": info["data"]}),
        "--batch_size", "32",
        "--output_path", str(work / "lm_eval"),
    ]  # fmt: skip
    cli_s, _ = _timed(cli, env)
    rows = [(f"lm_eval --tasks lacuna --limit {args.limit} (wall)", cli_s)]
    for defaults in (True, False):
        wall, out = _timed([sys.executable, "-c", INDEX_PROBE.format(defaults=defaults)], env)
        probe = json.loads(out)
        label = "built-in + lacuna" if defaults else "lacuna only"
        if defaults:
            rows.append(("  import lm_eval.tasks", probe["import"]))
        rows.append((f"  TaskManager index ({label}, {probe['names']} names)", probe["index"]))

    print(f"demo model + data built in {build_s:.1f} s (not part of the rows below)\n")
    print(f"| {'what':<58} | {'seconds':>8} | {'share of CLI wall':>17} |")
    print(f"|{'-' * 60}|{'-' * 10}|{'-' * 19}|")
    for label, seconds in rows:
        print(f"| {label:<58} | {seconds:8.1f} | {seconds / cli_s:17.2f} |")
    result = {"limit": args.limit, "rows": {label.strip(): round(sec, 2) for label, sec in rows}}
    (work / "bench_lm_eval.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
