"""Wall time, peak RSS, people, memorization, robustness and leak audit of a testbed build.

    python benchmarks/bench_testbed.py [--preset smoke|mini|standard] [--out DIR] [--set KEY=VALUE ...]
                                       [--threads N]
    python benchmarks/bench_testbed.py --existing DIR      # tables of a built testbed (audits a pre-v2 one)

Runs the real CLI (`lacuna build-testbed`) in a child process, reads its peak RSS (getrusage of children) and
the manifest, and prints: per-stage seconds; people per split and field; memorization per field (share of
forget / retain-group people extractable and eligible by greedy QA on fresh multi-sentence questions); the
robustness test (paraphrase and ICR probes: J_P / J_ICR and per-probe accuracy per split and field); and the
full leak audit (trivial detectors and null updates x scoring families x targets). ``--existing`` prints the same
tables for a testbed on disk; one built before the leak audit existed (manifest version 1) is audited on the spot
(`lacuna_metrics.localization.leak_audit.audit_testbed`). The masked/unmasked step-time ratio is `bench_masking.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--out", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to build-testbed")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the build (default: inherit)")
    parser.add_argument("--existing", default=None, help="print the tables of this testbed instead of building one")
    args = parser.parse_args()
    if args.existing:
        out = Path(args.existing)
        manifest = json.loads((out / "manifest.json").read_text())
        print(f"testbed {out} (preset {manifest.get('preset')}, manifest version {manifest.get('manifest_version')})")
    else:
        out = Path(args.out or tempfile.mkdtemp(prefix="bench_testbed_")) / args.preset
        lacuna = Path(sys.executable).with_name("lacuna")
        cmd = [str(lacuna), "build-testbed", "--preset", args.preset, "--out", str(out), "--force"]
        for item in args.set:
            cmd += ["--set", item]
        env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        wall = time.perf_counter() - start
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2
        manifest = json.loads((out / "manifest.json").read_text())
        print(f"preset {args.preset}: wall {wall:.1f} s (process), peak RSS {peak_gb:.2f} GB, out {out}")
        print(f"command: {' '.join(cmd)}  (OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')})")
    print_tables(out, manifest)


def print_tables(out: Path, manifest: dict[str, Any]) -> None:
    timings = manifest["timings_seconds"]
    print(f"\n| {'stage':<20} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 22}|{'-' * 10}|{'-' * 8}|")
    for stage, seconds in timings.items():
        if stage != "total":
            print(f"| {stage:<20} | {seconds:8.1f} | {seconds / timings['total']:6.2f} |")
    print(f"| {'total':<20} | {timings['total']:8.1f} | {1:6.2f} |")
    sizes = manifest["sizes"]
    print(
        f"\nparameters {sizes['parameters']:,}, eligible {sizes['eligible_parameters']:,}, masked per group "
        f"{sizes['masked_per_group']}, target people {sizes['target_people']}"
    )
    people = sizes.get("split_people")
    if people:
        fields = list(next(iter(people.values())))
        print("\npeople per split and field:")
        print("| split | " + " | ".join(fields) + " |")
        print("|---|" + "---|" * len(fields))
        for split, row in people.items():
            print(f"| {split} | " + " | ".join(str(row[f]) for f in fields) + " |")
    print("\nmemorization (fresh multi-sentence questions): extractable forget / retain, eligible forget / retain")
    for field, row in manifest["memorization"].items():
        if isinstance(row, dict) and "forget" in row:
            f, r = row["forget"], row["retain"]
            print(
                f"  {field:<16} {f['extractable']:.2f} / {r['extractable']:.2f}   {f['eligible']:.2f} / "
                f"{r['eligible']:.2f}   (people {f['people']} / {r['people']})"
            )
    robustness = manifest.get("robustness")
    if robustness:
        k = robustness.get("probes_per_person", 16)
        print(f"\nrobustness before unlearning ({k} paraphrase probes, {k} ICR probes per person):")
        print("| split | field | people | J_P | J_ICR | paraphrase acc | ICR acc |")
        print("|---|---|---|---|---|---|---|")
        for split in ("forget", "retain", "retain_eval"):
            for field, row in (robustness.get(split) or {}).items():
                print(
                    f"| {split} | {field} | {row.get('people')} | {row.get('j_p')} | {row.get('j_icr')} | "
                    f"{row.get('paraphrase_accuracy')} | {row.get('icr_accuracy')} |"
                )
    audit = manifest.get("leak_audit")
    if audit is None:
        from lacuna_metrics import audit_testbed

        print("\n(no leak audit in the manifest: auditing now)")
        audit = audit_testbed(out, seed=int(manifest.get("seed", 0)))
    print_audit(audit)


def print_audit(audit: dict[str, Any]) -> None:
    targets = ("forget", "unified", "forget_vs_retain")
    gate = f"trivial detectors <= {audit['max_auc']} on {audit['target']}"
    if "null_target" in audit:  # audits before issue 34 had one rule for every detector
        gate += f", null updates <= {audit['null_max_auc']} on {audit['null_target']}"
    print(
        f"\nleak audit (gate: {gate}: {'passed' if audit['passed'] else 'FAILED'}; worst {audit['worst']}; "
        f"{audit['seconds']} s)"
    )
    print("| detector | " + " | ".join(targets) + " |")
    print("|---|" + "---|" * len(targets))
    rows = [(name, aucs) for name, aucs in audit["trivial"].items()]
    rows += [(f"null {kind}: {score}", aucs) for kind, table in audit["null"].items() for score, aucs in table.items()]
    for name, aucs in rows:
        cells = ["—" if aucs.get(t) is None else f"{aucs[t]:.3f}" for t in targets]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if audit.get("not_applicable"):
        print("not applicable: " + ", ".join(sorted(audit["not_applicable"])))


if __name__ == "__main__":
    main()
