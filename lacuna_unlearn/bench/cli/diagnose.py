"""``lacuna diagnose``: representation diagnostics of updated checkpoints against a reference."""

from __future__ import annotations

import argparse
from pathlib import Path

from lacuna_unlearn.bench.cli.checks import (
    check_diagnose,
    int_at_least,
)

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help=(
        "representation diagnostics: per-layer PCA similarity/shift, linear CKA, Fisher "
        "(docs/definitions.md#representation-diagnostics)"
    )
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reference", required=True, help="reference HF checkpoint (e.g. before unlearning)")
    parser.add_argument("--updated", required=True, nargs="+", help="one or more updated HF checkpoints")
    parser.add_argument("--queries", default="forget", help="forget | retain (a LACUNA split) or a .txt/.jsonl FILE")
    parser.add_argument("--testbed", help="testbed directory (source of --queries forget/retain)")
    parser.add_argument("--data", help="LACUNA data directory (instead of --testbed)")
    parser.add_argument("--n", type=int_at_least(1), default=64, help="number of query texts")
    parser.add_argument("--pooling", default="masked_mean", choices=["masked_mean", "mean", "first", "last"])
    parser.add_argument("--max-length", type=int_at_least(1), default=128)
    parser.add_argument("--no-fisher", action="store_true", help="skip the Fisher diagonal (backward passes)")
    parser.add_argument("--out", help="output directory (default: lacuna_diagnose next to the first --updated)")
    parser.add_argument("--plots", action="store_true", help="also write per-layer and PCA-shift plots")


def run(args: argparse.Namespace) -> int:
    out = check_diagnose(args)
    from lacuna_metrics import calibration_texts, diagnose_models

    if args.queries in ("forget", "retain"):
        source = args.data or (_testbed_data(args.testbed) if args.testbed else None)
        if source is None:
            raise ValueError(f"--queries {args.queries} reads a LACUNA split: give --testbed DIR or --data DIR")
        texts = calibration_texts(source, args.queries, args.n)
    else:
        texts = calibration_texts(args.queries, "", args.n)
    result = diagnose_models(
        args.reference, args.updated, texts, pooling=args.pooling, max_length=args.max_length,
        fisher=not args.no_fisher, out_dir=out, plots=args.plots,
    )  # fmt: skip
    for entry in result["updated"]:
        print(f"{entry['path']}: mean PCA distance {entry['mean_pca_distance']}")
        print("  layer  pca_sim  cka")
        for row in entry["per_layer"]:
            print(f"  {row['layer']:>5}  {row['pca_sim']}  {row['cka']}")
    print(f"wrote {Path(out) / 'diagnose.json'}" + (" and plots/" if args.plots else ""))
    return 0


def _testbed_data(testbed: str) -> Path | None:
    """The data of a testbed of either layout (lacuna_metrics.layout)."""
    from lacuna_metrics import resolve_testbed

    return resolve_testbed(testbed).data
