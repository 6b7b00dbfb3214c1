"""``lacuna demo``: the testbed and the lm-eval tasks before unlearning (``lacuna run --preset demo``)."""

from __future__ import annotations

import argparse
from typing import Any

from lacuna_tasks import FIELDS
from lacuna_unlearn.bench.cli.checks import (
    testbed_dir,
)
from lacuna_unlearn.bench.cli.run import run_preset
from lacuna_unlearn.bench.run_config import RunConfig
from lacuna_unlearn.dataclass_config import preset_names

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help="build (or reuse) the mini testbed and evaluate it with the lacuna_<field> tasks (lacuna run --preset demo)",
    description="lacuna run --preset demo: the testbed and the lm-eval tasks before unlearning, nothing else.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fields = list(FIELDS)
    parser.add_argument("--out", default="runs/demo", help="run directory; stages are cached in OUT/stages")
    parser.add_argument(
        "--preset", choices=preset_names("testbed"), help=f"testbed preset (default: {RunConfig.preset})"
    )
    parser.add_argument("--testbed", help="evaluate this existing testbed instead of building one")
    parser.add_argument("--field", choices=fields, help=f"the field (default: {RunConfig().fields[0]})")
    parser.add_argument("--seed", type=int, default=None, help="testbed seed (default: the preset's)")
    parser.add_argument("--config", help="YAML run config over the demo preset")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="run setting: eval.batch_size=8"
    )


def run(args: argparse.Namespace) -> int:
    """``lacuna run --preset demo``: the flags choose the testbed preset (or an existing testbed), field and seed."""
    flags: dict[str, tuple[str, Any]] = {"preset": (f"--preset {args.preset}", args.preset)} if args.preset else {}
    flags.update({"fields": (f"--field {args.field}", [args.field])} if args.field else {})
    flags.update({"testbed_seed": (f"--seed {args.seed}", args.seed)} if args.seed is not None else {})
    if args.testbed:
        flags["testbed"] = (f"--testbed {args.testbed}", str(testbed_dir("--testbed", args.testbed)))
    return run_preset(args, "demo", flags, owned=("preset", "fields", "testbed_seed", "testbed"))
