"""The battery of method-free updates against the null calibration, on a built testbed (issue 34 item 5).

    python benchmarks/bench_null_battery.py TESTBED [--dtypes float32,bfloat16] [--workdir DIR] [--composite]

For every update of ``tests/helpers/method_free.py`` (Gaussian noise at 1e-3 .. 1e-1 x RMS, weight decay,
|θ|-proportional noise, sign steps; written as real safetensors pairs in each dtype, the before model re-saved in
that dtype) and the positive control (0.1 x RMS noise on forget-mask scalars only), scores the pair with
``score_pair`` against the testbed's masks and base, and prints one row per update, dtype and target: the
calibrated best (or "none"), its family, its lift, the verdict family's null spread, the uncalibrated best, and
``raw``'s calibration. The acceptance rule: method-free updates get a calibrated best of at most 0.55 (or none)
and a lift of at most 0.02 on every target; the positive control keeps at least 0.90 on forget with ``raw``
calibrated. Prints the wall time per score and the null calibration's share.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.method_free import BATTERY, forget_mask_of, gaussian, write_update  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("testbed", type=Path)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/lacuna_null_battery"))
    parser.add_argument("--composite", action="store_true", help="also fit the composite (slower)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    from lacuna_metrics import LocalizationConfig, score_pair

    updates = {**BATTERY, "forget_only_gaussian_1e-1": gaussian(1e-1)}
    only = forget_mask_of(args.testbed / "masks.safetensors")
    rows = []
    print("| update | dtype | target | calibrated best | family | lift | null sd | uncalibrated best | raw | s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for name, update in updates.items():
            pair = args.workdir / f"{name}_{dtype_name}"
            if not (pair / "after" / "model.safetensors").is_file():
                restrict = only if name.startswith("forget_only") else None
                write_update(args.testbed / "model", pair, update, dtype=dtype, only=restrict)
            started = time.perf_counter()
            result = score_pair(
                pair / "after", before=pair / "before", masks=args.testbed / "masks.safetensors",
                base=args.testbed / "base", frag=False, progress=False, allow_mask_mismatch=True,
                warn=lambda _m: None, config=LocalizationConfig(composite=args.composite),
            )  # fmt: skip
            seconds = time.perf_counter() - started
            cal = result["null_calibration"]
            for target, entry in cal["targets"].items():
                best, family = entry["best"]["value"], entry["best"]["score"]
                lift = entry["best_lift"]["value"]
                sd = (entry["families"].get(family) or {}).get("null_sd") if family else None
                raw = "calibrated" if "raw" not in entry["excluded"] else entry["excluded"]["raw"]
                unc = result["auc"][target]["best"]
                row = {
                    "update": name, "dtype": dtype_name, "target": target, "best": best, "family": family,
                    "lift": lift, "null_sd": sd, "uncalibrated": unc, "raw": raw, "seconds": round(seconds, 1),
                    "null_seconds": result["manifest"]["localization_timings"]["null_seconds"],
                }  # fmt: skip
                rows.append(row)
                print(
                    f"| {name} | {dtype_name} | {target} | {'none' if best is None else f'{best:.3f}'} | "
                    f"{family or '—'} | {'—' if lift is None else f'{lift:+.4f}'} | "
                    f"{'—' if sd is None else f'{sd:.4f}'} | {unc['score']} {unc['value']:.3f} | {raw} | "
                    f"{seconds:.0f} ({result['manifest']['localization_timings']['null_seconds']:.0f} null) |",
                    flush=True,
                )
    free = [r for r in rows if not r["update"].startswith("forget_only")]
    bad = [r for r in free if r["best"] is not None and (r["best"] > 0.55 or r["lift"] > 0.02)]
    control = [r for r in rows if r["update"].startswith("forget_only") and r["target"] == "forget"]
    ok_control = all(r["best"] is not None and r["best"] >= 0.9 and r["raw"] == "calibrated" for r in control)
    print()
    print(f"method-free updates winning a verdict above 0.55 or lift 0.02: {len(bad)} of {len(free)} rows")
    print(f"positive control (forget): {'kept' if ok_control else 'LOST'} its verdict with raw calibrated")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
