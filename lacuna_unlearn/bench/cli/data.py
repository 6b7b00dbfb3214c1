"""``lacuna data generate``: synthetic PANORAMA-style profiles and LACUNA QA splits in one directory."""

from __future__ import annotations

import argparse

from lacuna_unlearn.bench.cli.checks import int_at_least, writable

PARSER = dict(help="synthetic LACUNA data")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data_sub = parser.add_subparsers(dest="data_command", required=True)
    gen = data_sub.add_parser("generate", help="generate synthetic PANORAMA-style profiles and LACUNA QA splits")
    gen.add_argument("--profiles", type=int_at_least(1), default=1200, help="number of profiles (LACUNA: 1200)")
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--out", required=True, help="output directory (must be new or a previous dataset)")
    gen.add_argument(
        "--people-per-field",
        type=int_at_least(1),
        default=100,
        help="people per field on each side (forget and retain)",
    )
    gen.add_argument(
        "--validation-people",
        type=int_at_least(0),
        default=100,
        help="validation people per side (email and licence fields)",
    )
    gen.add_argument(
        "--retain-eval-people",
        type=int_at_least(0),
        default=0,
        help="held-out retain-eval people per field (retain side only; 0: no retain_eval split; docs/tasks.md)",
    )
    gen.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    writable("--out", args.out, directory=True)
    from lacuna_tasks import generate_dataset

    out = generate_dataset(
        args.out,
        profiles=args.profiles,
        seed=args.seed,
        people_per_field=args.people_per_field,
        validation_people=args.validation_people,
        retain_eval_people=args.retain_eval_people,
    )
    print(f"wrote LACUNA dataset to {out}")
    return 0
