"""``lacuna score``: score a checkpoint pair (localization AUC against the masks, FRAG, distances)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lacuna_unlearn.bench.cli.checks import (
    calib_fields,
    check_score,
    finite,
    int_at_least,
)

#: ``lacuna score`` flags whose defaults are the scorer's: ``LocalizationConfig`` fields and ``score_pair`` keywords.
LOCALIZATION_FLAGS = ("composite_samples", "bins_bits", "exact_limit", "seed", "qtile_ties", "threads")
SCORE_PAIR_FLAGS = (
    "gamma",
    "frag_target",
    "frag_min_coverage",
    "null_tolerance",
    "null_z",
    "null_min_lift",
    "null_draws",
    "null_samples",
    "calib_samples",
)


def score_defaults() -> dict[str, Any]:
    """The scorer's defaults, for ``lacuna score --help`` only (reading them imports torch)."""
    import inspect

    from lacuna_metrics import LocalizationConfig, score_pair

    config, params = LocalizationConfig(), inspect.signature(score_pair).parameters
    return {**{k: getattr(config, k) for k in LOCALIZATION_FLAGS}, **{k: params[k].default for k in SCORE_PAIR_FLAGS}}


#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help="score a checkpoint pair: localization ROC-AUC against the masks, FRAG, distances",
    description=(
        "Stream two HF checkpoints tensor by tensor and score the update "
        "(docs/definitions.md#localization-precision, #frag-score)."
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after", required=True, help="checkpoint after unlearning (HF directory)")
    parser.add_argument(
        "--testbed", help="testbed directory: defaults for --before/--masks/--base and calibration text"
    )
    parser.add_argument("--before", help="checkpoint before unlearning (default: TESTBED/model)")
    parser.add_argument("--masks", help="masks.safetensors or a LACUNA mask.pt (default: TESTBED/masks.safetensors)")
    parser.add_argument("--no-masks", action="store_true", help="skip localization (FRAG and distances only)")
    parser.add_argument("--base", help="reference checkpoint of the reversal scores (default: TESTBED/base)")
    parser.add_argument("--control-before", help="unmasked control model before unlearning (contrast scores)")
    parser.add_argument("--control-after", help="the same method run on the unmasked control model")
    parser.add_argument("--crossfield", nargs="+", help="after-checkpoints of the same method on each field")
    parser.add_argument("--calib-forget", help="FRAG forget calibration text: lacuna data dir, .jsonl or .txt")
    parser.add_argument("--calib-retain", help="FRAG retain calibration text: lacuna data dir, .jsonl or .txt")
    parser.add_argument(
        "--calib-fields",
        help="comma-separated fields (email, phone, birth_city, drivers_license) whose forget and retain rows "
        "calibrate FRAG: those the run unlearned (default: all, every field; docs/scoring.md 'FRAG calibration fields')",
    )
    parser.help_defaults = score_defaults
    parser.add_argument(
        "--calib-samples", type=int_at_least(1), help="calibration sequences per side (default %(default)s, as FRAG)"
    )
    parser.add_argument("--gamma", type=finite(0.0), help="FRAG retain penalty (default %(default)s, as FRAG)")
    parser.add_argument(
        "--frag-target",
        help="weights FRAG scores: all (every block projection: attention, MLP, experts, routers; default), "
        "attention, mlp (MLP and experts), expert, linear (every nn.Linear/Conv1D but lm_head and embeddings) or "
        "regex:PATTERN "
        "(checkpoint tensor names); see docs/anatomy.md",
    )
    parser.add_argument(
        "--frag-min-coverage",
        type=finite(0.0, 1.0),
        help="warn when FRAG's weights cover less than this share of the block weights (default 0.9)",
    )
    parser.add_argument("--no-frag", action="store_true", help="skip FRAG (no forward passes)")
    parser.add_argument(
        "--no-null",
        action="store_true",
        help="skip the null calibration (method-free updates at the update's own scale through every family; "
        "docs/scoring.md 'Null calibration')",
    )
    parser.add_argument(
        "--null-tolerance",
        type=finite(0.0, 0.5, open_ends=True),
        help="families whose null AUC (any null kind's mean) leaves 0.5 ± this are excluded from the calibrated best "
        "(%(default)s)",
    )
    parser.add_argument(
        "--null-z",
        type=finite(0.0),
        help="a family is calibrated when its lift over the null exceeds this many null standard deviations "
        "(%(default)s)",
    )
    parser.add_argument("--null-min-lift", type=finite(0.0, 0.5), help="... and at least this much AUC (%(default)s)")
    parser.add_argument(
        "--null-draws", type=int_at_least(2), help="draws of each random null kind: the spread's estimate (%(default)s)"
    )
    parser.add_argument(
        "--null-samples",
        type=int_at_least(1000),
        help="scalars of the universe sampled for the null updates (%(default)s; all when fewer)",
    )
    parser.add_argument("--activation-cache", help="activation statistics cache (default: $LACUNA_CACHE or ~/.cache)")
    parser.add_argument(
        "--scores", help="comma-separated scoring functions, 'composite' included (default: all applicable)"
    )
    parser.add_argument(
        "--composite-samples", type=int_at_least(0), help="composite subsample (%(default)s); 0 skips it"
    )
    parser.add_argument("--bins-bits", type=int_at_least(1), help="histogram bits beyond --exact-limit (%(default)s)")
    parser.add_argument(
        "--exact-limit", type=int_at_least(0), help="scalars scored exactly in memory per score (%(default)s)"
    )
    parser.add_argument(
        "--qtile-ties",
        choices=["average", "ordinal"],
        help="tied |delta| in qtile/crossfield: average ranks (default), or ordinal = index order as the release "
        "code (comparable with the paper, but ties become signal; docs/scoring.md)",
    )
    parser.add_argument("--seed", type=int, help="composite subsample seed (%(default)s)")
    parser.add_argument(
        "--threads",
        type=int_at_least(1),
        help="worker threads, each reading and scoring whole blocks; also the composite's folds (default: CPUs, at most 4)",
    )
    parser.add_argument("--out", help="output directory (default: AFTER/lacuna_score)")
    parser.add_argument(
        "--allow-mask-mismatch",
        action="store_true",
        help="score with masks whose recorded model fingerprint differs from --before's (refused by default: they "
        "were built for another model); masks that record none are always scored, with a warning",
    )
    parser.add_argument("--plots", action="store_true", help="also write plots/roc.png and plots/layers.png")
    parser.add_argument(
        "--lacuna-files",
        help="where to write the precision results in LACUNA's key names: DIR/{forget,unified}/metrics.json with "
        "provenance sidecars (default: OUT/lacuna); a DIR holding {target} is a layout, e.g. "
        "ROOT/cached_notebook_files/precision_metrics/{target}/Email_Address/SimNPO as LACUNA's scripts write it "
        "(docs/release.md)",
    )


def run(args: argparse.Namespace) -> int:
    check_score(args)
    from lacuna_metrics import (
        SCORES,
        LocalizationConfig,
        markdown_summary,
        publish_together,
        score_to_dir,
        update_warning,
    )
    from lacuna_unlearn.bench.report.lacuna_keys import LACUNA_TARGETS, score_lacuna_files, split_layout

    if not args.no_frag and args.frag_target is not None:
        from lacuna_metrics import check_target

        check_target(args.frag_target)
    scores = tuple(s for s in args.scores.split(",") if s) if args.scores else None
    if scores is not None and (bad := [s for s in scores if s not in (*SCORES, "composite")]):
        raise ValueError(f"--scores: unknown {bad}; choose from {','.join(SCORES)}")
    given = {k: getattr(args, k) for k in LOCALIZATION_FLAGS if getattr(args, k) is not None}
    if "composite_samples" in given:
        given["composite"] = given["composite_samples"] > 0
    config = LocalizationConfig(scores=scores, **given)
    pair = {k: getattr(args, k) for k in SCORE_PAIR_FLAGS if getattr(args, k) is not None}
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
        calib_fields=calib_fields(args.calib_fields),
        frag=not args.no_frag,
        null=not args.no_null,
        cache_dir=args.activation_cache,
        config=config,
        progress=not args.quiet,
        allow_mask_mismatch=args.allow_mask_mismatch,
        **pair,
    )

    result = json.loads((written / "score.json").read_text())
    lacuna_dir, layout = split_layout(args.lacuna_files) if args.lacuna_files else (written / "lacuna", "{target}")
    with publish_together(lacuna_dir) as staging:  # both targets' files appear together
        source = str((written / "score.json").resolve())
        lacuna_files = score_lacuna_files(result, staging, layout=layout, source=source)
    print(markdown_summary(result))
    coverage = (result.get("frag") or {}).get("coverage") or {}
    if coverage.get("warning"):
        print(f"warning: {coverage['warning']}")
    if warning := update_warning(result):
        print(f"lacuna: warning: {warning}", file=sys.stderr)
    print(f"wrote {written / 'score.json'} and {written / 'score.md'}" + (" and plots/" if args.plots else ""))
    if lacuna_files:
        print(f"wrote LACUNA's precision metrics.json for {', '.join(LACUNA_TARGETS)} under {lacuna_dir / layout}")
    return 0
