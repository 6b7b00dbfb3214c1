"""``lacuna meta``: which measurement predicts that forgetting lasts, over a run's pool (docs/meta.md)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from lacuna_unlearn.bench.cli.checks import int_at_least, writable
from lacuna_unlearn.dataclass_config import preset_names

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help="meta-evaluation: which predictor (localization AUC, FRAG, L2, PCA/CKA/Fisher, leak) predicts lasting "
    "forgetting, plus faithfulness and robustness of the metrics (docs/meta.md)",
    description="Meta-evaluate the pool of unlearned models of a `lacuna run` directory (with --preset: run the "
    "preset's `lacuna run` into RUN_DIR first, cached).",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a `lacuna run --out` directory (results.json, stages/)")
    parser.add_argument(
        "--preset", choices=preset_names("meta"), help="run this meta preset's `lacuna run` into RUN_DIR first"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="with --preset: a run setting over the preset's, as `lacuna run --set` (testbed=DIR)",
    )  # fmt: skip
    parser.add_argument("--out", help="output directory (default: RUN_DIR/meta)")
    parser.add_argument(
        "--checkpoints", action="append", default=[], metavar="PATH",
        help="more models for the pool, measured with the run's settings: a LACUNA unlearned_models/ tree (or the "
        "regime directory holding it), a YAML list of {path, method, field}, or a lacuna-unlearn checkpoint "
        "(repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--points", default=None, metavar="LIST",
        help="stopping points of the run's methods in the pool: chosen (default), chosen,end (the end of the "
        "schedule too), chosen,end,snapshots (every trajectory snapshot too)",
    )  # fmt: skip
    parser.add_argument("--no-noise", action="store_true", help="no noise controls in the pool")
    parser.add_argument("--no-diagnostics", action="store_true", help="no PCA/CKA/Fisher predictors")
    parser.add_argument("--quantize", default=None, help="bit widths of the quantization robustness, e.g. 8,4")
    parser.add_argument("--perturbations", type=int_at_least(1), default=None, help="faithfulness perturbations")
    parser.add_argument(
        "--headline", default=None, metavar="OUTCOME",
        help="the outcome the scatter plots and the ranking chart show (default leak_relearned_retain; e.g. "
        "leak_relearned_forget, success_at_n_relearned)",
    )  # fmt: skip
    parser.add_argument("--draws", type=int_at_least(100), default=None, help="bootstrap draws per interval")


def _bits(text: str) -> tuple[int, ...]:
    try:
        bits = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"--quantize: comma-separated bit widths in 2..8, got {text!r}") from None
    if not bits or any(not 2 <= b <= 8 for b in bits) or len(set(bits)) != len(bits):
        raise ValueError(f"--quantize: distinct bit widths in 2..8, got {text!r}")
    return bits


def _points(text: str) -> tuple[str, ...]:
    from lacuna_unlearn.bench.meta.sources import check_points

    return check_points([t.strip() for t in text.split(",") if t.strip()], "--points")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from lacuna_unlearn.bench.meta import MetaSettings, run_meta
    from lacuna_unlearn.bench.meta.run import load_meta_preset

    run_dir = Path(args.run_dir)
    if args.out is not None:
        writable("--out", args.out, directory=True)
    flags = {
        "noise": False if args.no_noise else None,
        "diagnostics": False if args.no_diagnostics else None,
        "quantize_bits": _bits(args.quantize) if args.quantize is not None else None,
        "perturbations": args.perturbations,
        "points": _points(args.points) if args.points is not None else None,
        "draws": args.draws,
        "headline": args.headline,
    }
    settings = MetaSettings()
    if args.set and args.preset is None:
        raise ValueError("--set changes the run of a --preset; without --preset, RUN_DIR's run is read as it is")
    if args.preset is not None:
        from lacuna_unlearn.dataclass_config import parse_overrides

        run_cfg, preset_settings = load_meta_preset(args.preset, parse_overrides(args.set))
        settings = preset_settings
        writable("RUN_DIR", run_dir, directory=True)
        if args.checkpoints:  # refused before the preset's run, naming the path
            from lacuna_unlearn.bench.meta.sources import read_checkpoints

            read_checkpoints(args.checkpoints, list(run_cfg["fields"]))
        from lacuna_unlearn.bench.run import run_benchmark

        run_benchmark(run_dir, run_cfg, log=logging.getLogger("lacuna_unlearn.bench.run").info)
    elif not (run_dir / "results.json").is_file():
        raise FileNotFoundError(
            f"{run_dir / 'results.json'}: not found; give a `lacuna run --out` directory, or --preset to run one"
        )
    settings = dataclasses.replace(settings, **{k: v for k, v in flags.items() if v is not None})
    meta = run_meta(
        run_dir,
        args.out,
        settings,
        checkpoints=args.checkpoints,
        log=logging.getLogger("lacuna_unlearn.bench.meta").info,
    )
    from lacuna_unlearn.bench.meta.report import meta_markdown

    print(meta_markdown(meta))
    out = Path(args.out) if args.out else run_dir / "meta"
    print(f"wrote {out / 'meta.json'}, {out / 'meta.md'} and {out / 'plots'}/")
    return 0
