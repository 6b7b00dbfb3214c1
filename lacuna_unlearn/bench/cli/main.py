"""The ``lacuna`` command: a thin dispatcher, one function per subcommand.

Lives in the top package of the dependency chain so it may call into all three packages; imports happen inside
each command so ``lacuna tasks path`` stays fast. Defaults and choices come from their homes: the run and testbed
configs and presets (``lacuna_unlearn/dataclass_config.py``), ``lacuna_tasks.schema.FIELDS``, ``lacuna_tasks.normalize.JUDGES``,
the attack configs, the scorer's ``LocalizationConfig``. The up-front checks are in ``cli_checks.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lacuna_tasks.logs import add_verbosity_arguments
from lacuna_unlearn.bench.cli.checks import (
    Parser,
    calib_fields,
    check_attack,
    check_diagnose,
    check_reversibility,
    check_score,
    existing,
    finite,
    int_at_least,
    seed_list,
    testbed_dir,
    writable,
)
from lacuna_unlearn.dataclass_config import config_choices, preset_names


def _tasks_path(args: argparse.Namespace) -> int:
    from lacuna_tasks import tasks_dir

    print(tasks_dir())
    return 0


def _data_generate(args: argparse.Namespace) -> int:
    writable("--out", args.out, directory=True)
    from lacuna_tasks.synth.generate import generate_dataset

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


def _demo(args: argparse.Namespace) -> int:
    """``lacuna run --preset demo``: the flags choose the testbed preset (or an existing testbed), field and seed."""
    flags: dict[str, Any] = {"preset": args.preset} if args.preset else {}
    flags.update({"fields": [args.field]} if args.field else {})
    flags.update({"testbed_seed": args.seed} if args.seed is not None else {})
    flags.update({"testbed": str(testbed_dir("--testbed", args.testbed))} if args.testbed else {})
    return _run_preset(args, "demo", flags)


def _build_testbed(args: argparse.Namespace) -> int:
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


def _score(args: argparse.Namespace) -> int:
    check_score(args)
    from lacuna_metrics.localization.precision import SCORES, LocalizationConfig
    from lacuna_metrics.report import markdown_summary
    from lacuna_metrics.score import score_to_dir

    if not args.no_frag and args.frag_target is not None:
        from lacuna_metrics.frag.activations import check_target

        check_target(args.frag_target)
    scores = tuple(s for s in args.scores.split(",") if s) if args.scores else None
    if scores is not None and (bad := [s for s in scores if s not in (*SCORES, "composite")]):
        raise ValueError(f"--scores: unknown {bad}; choose from {','.join(SCORES)}")
    given = {k: getattr(args, k) for k in _LOCALIZATION_FLAGS if getattr(args, k) is not None}
    if "composite_samples" in given:
        given["composite"] = given["composite_samples"] > 0
    config = LocalizationConfig(scores=scores, **given)
    pair = {k: getattr(args, k) for k in _SCORE_PAIR_FLAGS if getattr(args, k) is not None}
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
    import json

    result = json.loads((written / "score.json").read_text())
    print(markdown_summary(result))
    coverage = (result.get("frag") or {}).get("coverage") or {}
    if coverage.get("warning"):
        print(f"warning: {coverage['warning']}")
    print(f"wrote {written / 'score.json'} and {written / 'score.md'}" + (" and plots/" if args.plots else ""))
    return 0


def _attack(args: argparse.Namespace) -> int:
    out = check_attack(args)
    from lacuna_unlearn.bench.attacks import resurfacing_attack

    overrides = list(args.set)
    overrides += [f"source={args.source}"] if args.source else []
    overrides += [f"budget={args.budget}"] if args.budget else []
    report = resurfacing_attack(
        args.model,
        out,
        testbed=args.testbed,
        data=args.data,
        field=args.field,
        protocol=args.protocol,
        overrides=overrides,
        attempts=args.attempts,
        batch_size=args.batch_size,
        seed=args.seed,
        force=args.force,
        judge=args.judge,
    )
    n = report["persons"]
    print(
        f"| {args.field} ({n} forget persons, {args.attempts} attempts, judge {report['judge']}) "
        "| unlearned | relearned |"
    )
    print("|---|---|---|")
    print(
        f"| Success@{args.attempts} | {report['success_at_n_unlearned']:.3f} | {report['success_at_n_relearned']:.3f} |"
    )
    print(f"| leak rate per attempt | {report['leak_rate_unlearned']:.3f} | {report['leak_rate_relearned']:.3f} |")
    print(
        f"forgotten {len(report['forgotten'])}, resurfaced {len(report['resurfaced'])} "
        f"({report['pct_resurfaced_of_forgotten']:.1f}% of forgotten); wrote {Path(out) / 'attack.json'}"
    )
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    out = check_diagnose(args)
    from lacuna_metrics.diagnose.diagnostics import diagnose
    from lacuna_metrics.frag.activations import calibration_texts

    if args.queries in ("forget", "retain"):
        source = args.data or (str(Path(args.testbed) / "data") if args.testbed else None)
        if source is None:
            raise ValueError(f"--queries {args.queries} reads a LACUNA split: give --testbed DIR or --data DIR")
        texts = calibration_texts(source, args.queries, args.n)
    else:
        texts = calibration_texts(args.queries, "", args.n)
    result = diagnose(
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


def _reversibility(args: argparse.Namespace) -> int:
    diag = check_reversibility(args)
    import json

    from lacuna_metrics.behaviour.regimes import accuracies_from_lm_eval, classify_regime
    from lacuna_metrics.manifest import write_json

    forget_task, retain_task = f"lacuna_{args.field}_forget_qa", f"lacuna_{args.field}_retain_qa"
    acc = {
        name: accuracies_from_lm_eval(path, forget_task, retain_task)
        for name, path in (("original", args.original), ("unlearned", args.unlearned), ("relearned", args.relearned))
    }
    result = classify_regime(
        acc["original"][0], acc["unlearned"][0], acc["relearned"][0], acc["original"][1], acc["unlearned"][1],
        tau_rev=args.tau_rev, tau_cat=args.tau_cat, relative=args.relative,
    )  # fmt: skip
    result["accuracies"] = {k: {"forget": v[0], "retain": v[1]} for k, v in acc.items()}
    if diag is not None:
        result["representation"] = {
            entry["path"]: {
                "mean_pca_distance": entry.get("mean_pca_distance"),
                "pca_sim_by_layer": [row.get("pca_sim") for row in entry.get("per_layer", [])],
                "cka_by_layer": [row.get("cka") for row in entry.get("per_layer", [])],
            }
            for entry in diag.get("updated", [])
        }
    print(json.dumps({k: v for k, v in result.items() if k != "representation"}, indent=2))
    if args.out:
        write_json(Path(args.out), result)
        print(f"wrote {args.out}")
    return 0


def _run(args: argparse.Namespace) -> int:
    return _run_preset(args, args.preset, {"seeds": args.seeds} if args.seeds is not None else {})


def _run_preset(args: argparse.Namespace, preset: str, flags: dict[str, Any]) -> int:
    """``lacuna run`` of run preset ``preset``, updated by ``--config``, then ``--set``, then the command's own
    ``flags`` (dotted keys)."""
    existing("--config", args.config, "file")
    out = writable("--out", args.out or f"runs/{preset}", directory=True)
    from lacuna_unlearn.bench.report.markdown import run_markdown
    from lacuna_unlearn.bench.run import load_run_config, run_benchmark
    from lacuna_unlearn.dataclass_config import parse_overrides

    overrides = {**parse_overrides(args.set), **flags}
    cfg = load_run_config(args.config, preset=preset, overrides=overrides)
    results = run_benchmark(out, cfg, log=logging.getLogger("lacuna_unlearn.bench.run").info)
    print(run_markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {out / 'plots'}/")
    return 0


#: ``lacuna score`` flags whose defaults are the scorer's: ``LocalizationConfig`` fields and ``score_pair`` keywords.
_LOCALIZATION_FLAGS = ("composite_samples", "bins_bits", "exact_limit", "seed", "qtile_ties", "threads")
_SCORE_PAIR_FLAGS = ("gamma", "frag_target", "frag_min_coverage", "null_tolerance", "calib_samples")


def _score_defaults() -> dict[str, Any]:
    """The scorer's defaults, for ``lacuna score --help`` only (reading them imports torch)."""
    import inspect

    from lacuna_metrics.localization.precision import LocalizationConfig
    from lacuna_metrics.score import score_pair

    config, params = LocalizationConfig(), inspect.signature(score_pair).parameters
    return {**{k: getattr(config, k) for k in _LOCALIZATION_FLAGS}, **{k: params[k].default for k in _SCORE_PAIR_FLAGS}}


def build_parser() -> argparse.ArgumentParser:
    from lacuna_tasks.normalize import JUDGES  # no torch: cheap
    from lacuna_tasks.schema import FIELDS
    from lacuna_unlearn.bench.run_config import AttackConfig, EvalConfig, RegimeConfig, RunConfig

    fields = list(FIELDS)
    parser = Parser(prog="lacuna", description="lacuna-bench: measure whether unlearning erased it.")
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="lm-eval task pack helpers")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    path = tasks_sub.add_parser("path", help="print the task YAML directory (for lm_eval --include_path)")
    path.set_defaults(func=_tasks_path)

    data = sub.add_parser("data", help="synthetic LACUNA data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
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
    gen.set_defaults(func=_data_generate)

    tb = sub.add_parser("build-testbed", help="build a LACUNA testbed (masked PII injection with ground-truth masks)")
    tb.add_argument("--preset", default=RunConfig.preset, choices=preset_names("testbed"))
    tb.add_argument("--out", required=True, help="output directory (built in OUT.partial, renamed when done)")
    tb.add_argument("--seed", type=int, default=None)
    tb.add_argument("--unmasked", action="store_true", help="control regime: the same pipeline without masks")
    tb.add_argument("--model", default=None, help="start from this local HF checkpoint instead of a from-scratch model")
    tb.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset setting: pii_steps=3000"
    )
    tb.add_argument("--force", action="store_true", help="replace an existing OUT")
    tb.set_defaults(func=_build_testbed)

    demo = sub.add_parser(
        "demo",
        help="build (or reuse) the mini testbed and evaluate it with the lacuna_<field> tasks (lacuna run --preset demo)",
        description="lacuna run --preset demo: the testbed and the lm-eval tasks before unlearning, nothing else.",
    )
    demo.add_argument("--out", default="runs/demo", help="run directory; stages are cached in OUT/stages")
    demo.add_argument("--preset", choices=preset_names("testbed"), help=f"testbed preset (default: {RunConfig.preset})")
    demo.add_argument("--testbed", help="evaluate this existing testbed instead of building one")
    demo.add_argument("--field", choices=fields, help=f"the field (default: {RunConfig().fields[0]})")
    demo.add_argument("--seed", type=int, default=None, help="testbed seed (default: the preset's)")
    demo.add_argument("--config", help="YAML run config over the demo preset")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run setting: eval.batch_size=8")
    demo.set_defaults(func=_demo)

    score = sub.add_parser(
        "score",
        help="score a checkpoint pair: localization ROC-AUC against the masks, FRAG, distances",
        description=(
            "Stream two HF checkpoints tensor by tensor and score the update "
            "(docs/definitions.md#localization-precision, #frag-score)."
        ),
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
    score.add_argument(
        "--calib-fields",
        help="comma-separated fields (email, phone, birth_city, drivers_license) whose forget and retain rows "
        "calibrate FRAG: those the run unlearned (default: all, every field; docs/scoring.md 'FRAG calibration fields')",
    )
    score.help_defaults = _score_defaults
    score.add_argument(
        "--calib-samples", type=int_at_least(1), help="calibration sequences per side (default %(default)s, as FRAG)"
    )
    score.add_argument("--gamma", type=finite(0.0), help="FRAG retain penalty (default %(default)s, as FRAG)")
    score.add_argument(
        "--frag-target",
        help="weights FRAG scores: all (every block projection: attention, MLP, experts, routers; default), "
        "attention, mlp (MLP and experts), expert, linear (every nn.Linear/Conv1D but lm_head and embeddings) or "
        "regex:PATTERN "
        "(checkpoint tensor names); see docs/anatomy.md",
    )
    score.add_argument(
        "--frag-min-coverage",
        type=finite(0.0, 1.0),
        help="warn when FRAG's weights cover less than this share of the block weights (default 0.9)",
    )
    score.add_argument("--no-frag", action="store_true", help="skip FRAG (no forward passes)")
    score.add_argument(
        "--no-null",
        action="store_true",
        help="skip the null calibration (null updates through every family; docs/scoring.md 'Null calibration')",
    )
    score.add_argument(
        "--null-tolerance",
        type=finite(0.0, 0.5),
        help="families whose null AUC leaves 0.5 ± this are excluded from the calibrated best (%(default)s)",
    )
    score.add_argument("--activation-cache", help="activation statistics cache (default: $LACUNA_CACHE or ~/.cache)")
    score.add_argument(
        "--scores", help="comma-separated scoring functions, 'composite' included (default: all applicable)"
    )
    score.add_argument(
        "--composite-samples", type=int_at_least(0), help="composite subsample (%(default)s); 0 skips it"
    )
    score.add_argument("--bins-bits", type=int_at_least(1), help="histogram bits beyond --exact-limit (%(default)s)")
    score.add_argument(
        "--exact-limit", type=int_at_least(0), help="scalars scored exactly in memory per score (%(default)s)"
    )
    score.add_argument(
        "--qtile-ties",
        choices=["average", "ordinal"],
        help="tied |delta| in qtile/crossfield: average ranks (default), or ordinal = index order as the release "
        "code (comparable with the paper, but ties become signal; docs/scoring.md)",
    )
    score.add_argument("--seed", type=int, help="composite subsample seed (%(default)s)")
    score.add_argument(
        "--threads",
        type=int_at_least(1),
        help="worker threads, each reading and scoring whole blocks; also the composite's folds (default: CPUs, at most 4)",
    )
    score.add_argument("--out", help="output directory (default: AFTER/lacuna_score)")
    score.add_argument(
        "--allow-mask-mismatch",
        action="store_true",
        help="score with masks whose recorded model fingerprint differs from --before's (refused by default: they "
        "were built for another model); masks that record none are always scored, with a warning",
    )
    score.add_argument("--plots", action="store_true", help="also write plots/roc.png and plots/layers.png")
    score.set_defaults(func=_score)

    attack = sub.add_parser(
        "attack",
        help="relearning attack on an unlearned model + extraction probe before/after (Success@N, resurfaced)",
        description=(
            "Relearn with a lacuna-unlearn attack preset, then probe both models "
            "(docs/definitions.md#relearning-attacks)."
        ),
    )
    attack.add_argument("--model", required=True, help="the unlearned HF checkpoint to attack")
    attack.add_argument("--testbed", help="testbed directory (data for the attack and the probe)")
    attack.add_argument("--data", help="LACUNA data directory (instead of --testbed)")
    attack.add_argument("--field", default=fields[0], choices=fields)
    attack.add_argument("--protocol", default=AttackConfig.protocol, choices=config_choices("attack"))
    attack.add_argument("--source", help="relearn_split | retain | forget | forget_retain | unrelated")
    attack.add_argument("--budget", help="rows: 'forget' (= |D_f|, restricted relearning) or a count")
    attack.add_argument(
        "--attempts", type=int_at_least(1), default=AttackConfig.attempts, help="extraction prompts per person"
    )
    attack.add_argument(
        "--batch-size", type=int_at_least(1), default=EvalConfig.batch_size, help="probe generation batch size"
    )
    attack.add_argument(
        "--judge",
        default=AttackConfig.judge,
        choices=list(JUDGES),
        help="leak rule of Success@N: lacuna (LACUNA's: lower-case containment in the whole 20 tokens; default, "
        "comparable with the paper), first_line (lacuna-bench's lm-eval rule), loose; attack.json keeps all three "
        "under by_judge (docs/tasks.md 'Judges')",
    )
    attack.add_argument("--seed", type=int, default=RunConfig.seed)
    attack.add_argument(
        "--set", action="append", default=[], help="Hydra override, e.g. trainer.args.learning_rate=1e-5"
    )
    attack.add_argument("--out", help="output directory (default: MODEL_attack_PROTOCOL next to the model)")
    attack.add_argument("--force", action="store_true", help="overwrite --out")
    attack.set_defaults(func=_attack)

    diag = sub.add_parser(
        "diagnose",
        help=(
            "representation diagnostics: per-layer PCA similarity/shift, linear CKA, Fisher "
            "(docs/definitions.md#representation-diagnostics)"
        ),
    )
    diag.add_argument("--reference", required=True, help="reference HF checkpoint (e.g. before unlearning)")
    diag.add_argument("--updated", required=True, nargs="+", help="one or more updated HF checkpoints")
    diag.add_argument("--queries", default="forget", help="forget | retain (a LACUNA split) or a .txt/.jsonl FILE")
    diag.add_argument("--testbed", help="testbed directory (source of --queries forget/retain)")
    diag.add_argument("--data", help="LACUNA data directory (instead of --testbed)")
    diag.add_argument("--n", type=int_at_least(1), default=64, help="number of query texts")
    diag.add_argument("--pooling", default="masked_mean", choices=["masked_mean", "mean", "first", "last"])
    diag.add_argument("--max-length", type=int_at_least(1), default=128)
    diag.add_argument("--no-fisher", action="store_true", help="skip the Fisher diagonal (backward passes)")
    diag.add_argument("--out", help="output directory (default: lacuna_diagnose next to the first --updated)")
    diag.add_argument("--plots", action="store_true", help="also write per-layer and PCA-shift plots")
    diag.set_defaults(func=_diagnose)

    rev = sub.add_parser(
        "reversibility",
        help=(
            "recovery ratio, catastrophic drop and the forgetting regime from lm-eval results "
            "(docs/definitions.md#forgetting-regimes)"
        ),
    )
    rev.add_argument("--original", required=True, help="lm-eval results (file or --output_path dir), original model")
    rev.add_argument("--unlearned", required=True, help="lm-eval results of the unlearned model")
    rev.add_argument("--relearned", required=True, help="lm-eval results of the relearned model")
    rev.add_argument("--field", default=fields[0], choices=fields)
    rev.add_argument("--tau-rev", type=finite(), default=RegimeConfig.tau_rev, help="reversible iff recovery >= this")
    rev.add_argument("--tau-cat", type=finite(), default=RegimeConfig.tau_cat, help="catastrophic iff drop > this")
    rev.add_argument("--relative", action="store_true", help="retain drop relative to the original accuracy")
    rev.add_argument("--diagnose", help="diagnose.json to attach as representation evidence")
    rev.add_argument("--out", help="write the result JSON here")
    rev.set_defaults(func=_reversibility)

    run = sub.add_parser(
        "run",
        help="the whole benchmark: testbed, unlearning methods, lm-eval, scores, attacks, regimes, report",
        description="Run (or resume from the stage cache) a declarative experiment; default: the mini preset.",
    )
    run.add_argument("--preset", default=RunConfig.preset, choices=preset_names("run"), help="run preset")
    run.add_argument("--config", help="YAML run config overriding the preset (fields, methods, probes)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run setting: attack.attempts=50")
    run.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        help="unlearning seeds, e.g. 1,2,3: every method once per seed, mean ± sd of every metric (docs/report.md)",
    )
    run.add_argument("--out", help="run directory (default: runs/PRESET); stages are cached in OUT/stages")
    run.set_defaults(func=_run)

    from lacuna_unlearn.bench.gate import command as gate_module  # argparse flags live with the gate logic

    gate = sub.add_parser(
        "gate",
        help="CI gate: pass/fail criteria over results.json, lm-eval results or score.json (exit 1 on failure)",
        description="Check thresholds (--max-leak, --min-auc, --check PATH<=X, ...); see docs/ci.md.",
    )
    gate_module.add_arguments(gate)
    gate.set_defaults(func=gate_module.run)
    for command in _leaves(parser):  # -v/-q on every command; main() configures logging once
        add_verbosity_arguments(command)
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of the runnable subcommands (``lacuna tasks path``, ``lacuna run``, ...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for action in subs for child in dict.fromkeys(action.choices.values()) for leaf in _leaves(child)]


class Terminated(SystemExit):
    """Raised by the SIGTERM handler: unwinds like Ctrl-C, so every ``OUT.partial`` is removed on the way out."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    from lacuna_tasks.logs import configure_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    try:
        from lacuna_metrics.weights.threads import configure_threads

        configure_threads()  # OMP_NUM_THREADS if set, else every core (measured: docs/distributed.md "Threads")
    except ValueError as exc:
        print(f"lacuna: error: {exc}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:  # our errors name the file/field at fault; OSError: unwritable/full disk
        print(f"lacuna: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lacuna: interrupted; partial outputs removed", file=sys.stderr)
        return 130
    except Terminated as exc:
        print("lacuna: terminated (SIGTERM); partial outputs removed", file=sys.stderr)
        return int(exc.code or 143)


if __name__ == "__main__":
    sys.exit(main())
