"""``lacuna run``: the whole benchmark as one cached pipeline."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.cli.checks import (
    existing,
    one_value,
    seed_list,
    writable,
)
from lacuna_unlearn.bench.run_config import RunConfig
from lacuna_unlearn.dataclass_config import preset_names


def run_preset(
    args: argparse.Namespace, preset: str, flags: Mapping[str, tuple[str, Any]], owned: Collection[str]
) -> int:
    """``lacuna run`` of run preset ``preset``, updated by ``--config``, then by the command line: ``--set`` and the
    command's own ``flags`` (dotted key -> (the flag as typed, its value)), which must agree where both name a
    setting (``owned``: the settings the command has flags for; :func:`~lacuna_unlearn.bench.cli.checks.one_value`)."""
    one_value(flags, args.set, owned=owned, paths=("testbed",))
    existing("--config", args.config, "file")
    if args.out is not None:
        writable("--out", args.out, directory=True)
    from lacuna_metrics import is_release_dir
    from lacuna_unlearn.bench.report.markdown import run_markdown
    from lacuna_unlearn.bench.run import load_run_config, run_benchmark
    from lacuna_unlearn.dataclass_config import parse_overrides

    overrides = {**parse_overrides(args.set), **{key: value for key, (_, value) in flags.items()}}
    cfg = load_run_config(args.config, preset=preset, overrides=overrides)
    # On a LACUNA release without --out: the run directory inside the regime directory, and the unlearned models
    # with LACUNA's files where its own scripts look, <regime>/unlearned_models/<Field>/<Method>/ (docs/release.md).
    release = Path(cfg["testbed"]) if cfg.get("testbed") and is_release_dir(cfg["testbed"]) else None
    lacuna_root = release if release is not None and args.out is None else None
    default_out = release / "lacuna-bench" / preset if release is not None else Path("runs") / preset
    out = writable("--out", args.out or default_out, directory=True)
    results = run_benchmark(out, cfg, log=logging.getLogger("lacuna_unlearn.bench.run").info, lacuna_root=lacuna_root)
    print(run_markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {out / 'plots'}/")
    where = lacuna_root if lacuna_root is not None else out / "lacuna"
    print(f"wrote the unlearned models and LACUNA's files under {where / 'unlearned_models'}/")
    return 0


#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help="the whole benchmark: testbed, unlearning methods, lm-eval, scores, attacks, regimes, report",
    description="Run (or resume from the stage cache) a declarative experiment; default: the mini preset.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=RunConfig.preset, choices=preset_names("run"), help="run preset")
    parser.add_argument("--config", help="YAML run config overriding the preset (fields, methods, probes)")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="run setting: attack.attempts=50"
    )
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        help="unlearning seeds, e.g. 1,2,3: every method once per seed, mean ± sd of every metric (docs/report.md)",
    )
    parser.add_argument("--out", help="run directory (default: runs/PRESET); stages are cached in OUT/stages")


def run(args: argparse.Namespace) -> int:
    seeds = {"seeds": (f"--seeds {','.join(map(str, args.seeds))}", args.seeds)} if args.seeds is not None else {}
    return run_preset(args, args.preset, seeds, owned=("seeds",))
