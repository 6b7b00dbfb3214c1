"""``lacuna build-testbed``: build a testbed (masked PII injection with ground-truth masks)."""

from __future__ import annotations

import argparse

from lacuna_unlearn.bench.cli.checks import (
    existing,
    one_value,
    writable,
)
from lacuna_unlearn.bench.run_config import RunConfig
from lacuna_unlearn.dataclass_config import preset_names

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(help="build a LACUNA testbed (masked PII injection with ground-truth masks)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=RunConfig.preset, choices=preset_names("testbed"))
    parser.add_argument("--out", required=True, help="output directory (built in OUT.partial, renamed when done)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--unmasked", action="store_true", help="control regime: the same pipeline without masks")
    parser.add_argument(
        "--model", default=None, help="start from this local HF checkpoint instead of a from-scratch model"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset setting: pii_steps=3000"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")


def run(args: argparse.Namespace) -> int:
    given = {"seed": (f"--seed {args.seed}", args.seed)} if args.seed is not None else {}
    one_value(given, args.set, owned=("seed",))  # --seed 1 --set seed=2: refused, not one of them ignored
    existing("--model", args.model, "dir")
    writable("--out", args.out, directory=True)
    from lacuna_unlearn.dataclass_config import parse_overrides
    from lacuna_unlearn.testbed.build import build_testbed

    out = build_testbed(
        args.out,
        preset=args.preset,
        seed=args.seed,
        unmasked=args.unmasked,
        model=args.model,
        overrides=parse_overrides(args.set),
        force=args.force,
    )
    print(f"testbed written to {out}")
    return 0
