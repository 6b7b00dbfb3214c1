"""The ``lacuna`` command: a thin dispatcher, one public function per subcommand.

Lives in the top package of the dependency chain so it may call into all three packages;
imports happen inside each command so ``lacuna tasks path`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _tasks_path(args: argparse.Namespace) -> int:
    from lacuna_tasks import tasks_dir

    print(tasks_dir())
    return 0


def _data_generate(args: argparse.Namespace) -> int:
    from lacuna_tasks.generate import generate_dataset

    out = generate_dataset(
        args.out,
        profiles=args.profiles,
        seed=args.seed,
        people_per_field=args.people_per_field,
        validation_people=args.validation_people,
    )
    print(f"wrote LACUNA dataset to {out}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from lacuna_unlearn.quickstart import run_demo

    out = run_demo(args.out, preset=args.preset, field=args.field, seed=args.seed)
    print(f"demo results in {out}")
    return 0


def _build_testbed(args: argparse.Namespace) -> int:
    from lacuna_unlearn.testbed import build_testbed

    out = build_testbed(
        args.out,
        preset=args.preset,
        seed=args.seed,
        unmasked=args.unmasked,
        model=args.model,
        overrides=_parse_overrides(args.set),
        force=args.force,
    )
    print(f"testbed written to {out}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from lacuna_metrics.localization import SCORES, LocalizationConfig
    from lacuna_metrics.report import markdown_summary
    from lacuna_metrics.score import score_to_dir

    if args.testbed is None and (args.before is None or args.masks is None and not args.no_masks):
        raise ValueError("give --testbed DIR, or --before DIR with --masks FILE (or --no-masks for FRAG/distance only)")
    scores = tuple(s for s in args.scores.split(",") if s) if args.scores else None
    if scores is not None and (bad := [s for s in scores if s not in (*SCORES, "composite")]):
        raise ValueError(f"--scores: unknown {bad}; choose from {','.join(SCORES)}")
    config = LocalizationConfig(
        scores=scores,
        composite=args.composite_samples > 0,
        composite_samples=args.composite_samples,
        bins_bits=args.bins_bits,
        exact_limit=args.exact_limit,
        seed=args.seed,
    )
    out = args.out or str(Path(args.after) / "lacuna_score")
    written = score_to_dir(
        out,
        plots=args.plots,
        after=args.after,
        before=args.before,
        masks=args.masks,
        localize=not args.no_masks,
        testbed=args.testbed,
        base=args.base,
        control_before=args.control_before,
        control_after=args.control_after,
        crossfield=args.crossfield or (),
        calib_forget=args.calib_forget,
        calib_retain=args.calib_retain,
        frag=not args.no_frag,
        gamma=args.gamma,
        frag_target=args.frag_target,
        calib_samples=args.calib_samples,
        cache_dir=args.activation_cache,
        config=config,
        progress=not args.quiet,
    )
    import json

    print(markdown_summary(json.loads((written / "score.json").read_text())))
    print(f"wrote {written / 'score.json'} and {written / 'score.md'}" + (" and plots/" if args.plots else ""))
    return 0


def _parse_overrides(items: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values parsed as JSON when possible (numbers, booleans, lists)."""
    import json

    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lacuna", description="lacuna-bench: measure whether unlearning erased it.")
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="lm-eval task pack helpers")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    path = tasks_sub.add_parser("path", help="print the task YAML directory (for lm_eval --include_path)")
    path.set_defaults(func=_tasks_path)

    data = sub.add_parser("data", help="synthetic LACUNA data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    gen = data_sub.add_parser("generate", help="generate synthetic PANORAMA-style profiles and LACUNA QA splits")
    gen.add_argument("--profiles", type=int, default=1200, help="number of profiles (LACUNA: 1200)")
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--out", required=True, help="output directory (must be new or a previous dataset)")
    gen.add_argument(
        "--people-per-field", type=int, default=100, help="people per field on each side (forget and retain)"
    )
    gen.add_argument(
        "--validation-people", type=int, default=100, help="validation people per side (email and licence fields)"
    )
    gen.set_defaults(func=_data_generate)

    tb = sub.add_parser("build-testbed", help="build a LACUNA testbed (masked PII injection with ground-truth masks)")
    tb.add_argument("--preset", default="mini", choices=["smoke", "mini", "lacuna"])
    tb.add_argument("--out", required=True, help="output directory (built in OUT.partial, renamed when done)")
    tb.add_argument("--seed", type=int, default=None)
    tb.add_argument("--unmasked", action="store_true", help="control regime: the same pipeline without masks")
    tb.add_argument("--model", default=None, help="start from this local HF checkpoint instead of a from-scratch model")
    tb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset setting")
    tb.add_argument("--force", action="store_true", help="replace an existing OUT")
    tb.set_defaults(func=_build_testbed)

    demo = sub.add_parser("demo", help="build (or reuse) the mini testbed and run lm_eval --tasks lacuna_<field> on it")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--preset", default="mini", choices=["smoke", "mini"])
    demo.add_argument("--field", default="email", choices=["email", "phone", "birth_city", "drivers_license"])
    demo.add_argument("--seed", type=int, default=None)
    demo.set_defaults(func=_demo)

    score = sub.add_parser(
        "score",
        help="score a checkpoint pair: localization ROC-AUC against the masks, FRAG, distances",
        description="Stream two HF checkpoints tensor by tensor and score the update (spec §1.10, §3.3).",
    )
    score.add_argument("--after", required=True, help="checkpoint after unlearning (HF directory)")
    score.add_argument("--testbed", help="testbed directory: defaults for --before/--masks/--base and calibration text")
    score.add_argument("--before", help="checkpoint before unlearning (default: TESTBED/model)")
    score.add_argument("--masks", help="masks.safetensors or a LACUNA mask.pt (default: TESTBED/masks.safetensors)")
    score.add_argument("--no-masks", action="store_true", help="skip localization (FRAG and distances only)")
    score.add_argument("--base", help="reference checkpoint of the reversal scores (default: TESTBED/base)")
    score.add_argument("--control-before", help="unmasked control model before unlearning (contrast scores)")
    score.add_argument("--control-after", help="the same method run on the unmasked control model")
    score.add_argument("--crossfield", nargs="+", help="after-checkpoints of the same method on each field")
    score.add_argument("--calib-forget", help="FRAG forget calibration text: lacuna data dir, .jsonl or .txt")
    score.add_argument("--calib-retain", help="FRAG retain calibration text: lacuna data dir, .jsonl or .txt")
    score.add_argument("--calib-samples", type=int, default=128, help="calibration sequences per side (spec: 128)")
    score.add_argument("--gamma", type=float, default=1.0, help="FRAG retain penalty (spec default 1)")
    score.add_argument("--frag-target", default="all", choices=["all", "mlp", "linear"])
    score.add_argument("--no-frag", action="store_true", help="skip FRAG (no forward passes)")
    score.add_argument("--activation-cache", help="activation statistics cache (default: $LACUNA_CACHE or ~/.cache)")
    score.add_argument(
        "--scores", help="comma-separated scoring functions, 'composite' included (default: all applicable)"
    )
    score.add_argument("--composite-samples", type=int, default=2_000_000, help="composite subsample; 0 skips it")
    score.add_argument("--bins-bits", type=int, default=20, help="histogram resolution beyond --exact-limit")
    score.add_argument("--exact-limit", type=int, default=1 << 22, help="scalars scored exactly in memory per score")
    score.add_argument("--seed", type=int, default=42)
    score.add_argument("--out", help="output directory (default: AFTER/lacuna_score)")
    score.add_argument("--plots", action="store_true", help="also write plots/roc.png and plots/layers.png")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=_score)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:  # our errors name the file/field at fault
        print(f"lacuna: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
