"""The ``lacuna`` command: a thin dispatcher, one public function per subcommand.

Lives in the top package of the dependency chain so it may call into all three packages;
imports happen inside each command so ``lacuna tasks path`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# -- up-front checks -------------------------------------------------------------------------------------
# Every command checks what it can without loading a model (paths, output directories, numbers) before it
# imports torch or reads a weight, so a typo fails in well under a second with one line naming the culprit.


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``lacuna score: error: ... (see lacuna score --help)``, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _finite(low: float | None = None, high: float | None = None):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            raise argparse.ArgumentTypeError(f"{value} is outside {bounds}")
        return value

    parse.__name__ = "number"
    return parse


def _existing(flag: str, value: str | os.PathLike[str] | None, kind: str = "any") -> Path | None:
    """``value`` as a Path that exists (``kind``: ``dir``, ``file`` or ``any``); None stays None."""
    if value is None:
        return None
    path = Path(value)
    if not path.exists():
        raise FileNotFoundError(f"{flag} {path}: no such file or directory")
    if kind == "dir" and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path}: not a directory")
    if kind == "file" and not path.is_file():
        raise IsADirectoryError(f"{flag} {path}: not a file")
    return path


def _testbed(flag: str, value: str | None) -> Path | None:
    path = _existing(flag, value, "dir")
    if path is not None and not (path / "manifest.json").is_file():
        raise ValueError(f"{flag} {path}: not a testbed (no manifest.json)")
    return path


def _writable(flag: str, value: str | os.PathLike[str], *, directory: bool) -> Path:
    """``value`` can be created or replaced: a directory (``directory``) or a file whose first existing
    ancestor is a writable directory. Checked before any work, so a read-only disk fails at once."""
    path = Path(value)
    if path.exists() and path.is_dir() != directory:
        raise ValueError(f"{flag} {path}: exists and is {'a file' if directory else 'a directory'}")
    ancestor = path if path.exists() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path}: {ancestor} is not writable")
    return path


def _check_score(args: argparse.Namespace) -> None:
    _existing("--after", args.after)
    testbed = _testbed("--testbed", args.testbed)
    if testbed is not None and not (testbed / "model").is_dir():
        raise ValueError(f"--testbed {testbed}: not a testbed (no model/)")
    for flag in ("before", "base", "control_before", "control_after", "calib_forget", "calib_retain"):
        _existing("--" + flag.replace("_", "-"), getattr(args, flag))
    _existing("--masks", args.masks, "file")
    for path in args.crossfield or ():
        _existing("--crossfield", path)
    if (args.control_before is None) != (args.control_after is None):
        raise ValueError("give both --control-before and --control-after, or neither")
    if args.no_masks and args.masks:
        raise ValueError("--masks and --no-masks contradict each other")
    if testbed is None and (args.before is None or args.masks is None and not args.no_masks):
        raise ValueError("give --testbed DIR, or --before DIR with --masks FILE (or --no-masks for FRAG/distance only)")
    if (
        testbed is not None
        and not args.no_masks
        and args.masks is None
        and not (testbed / "masks.safetensors").is_file()
    ):
        raise FileNotFoundError(f"--testbed {testbed}: no masks.safetensors (give --masks FILE or --no-masks)")
    _calib_fields(args.calib_fields)
    if args.activation_cache:
        _writable("--activation-cache", args.activation_cache, directory=True)
    _writable("--out", args.out or Path(args.after) / "lacuna_score", directory=True)


def _calib_fields(value: str | None) -> list[str] | None:
    """``--calib-fields a,b`` as field keys (None or ``all``: every field); ValueError naming the known fields."""
    if value is None or value.strip() == "all":
        return None
    from lacuna_tasks.schema import get_field  # not lacuna_metrics.activations: an argument error needs no torch

    names = [part.strip() for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError(f"--calib-fields {value!r}: name at least one field (email, phone, birth_city, ...)")
    keys: list[str] = []
    for name in names:
        try:
            key = get_field(name).key
        except ValueError as exc:
            raise ValueError(f"--calib-fields: {exc}") from None
        keys += [key] if key not in keys else []
    return keys


def _check_attack(args: argparse.Namespace) -> Path:
    """The attack's inputs and output; returns ``--out`` (default: ``MODEL_attack_PROTOCOL``)."""
    model = _existing("--model", args.model, "dir")
    assert model is not None
    _testbed("--testbed", args.testbed)
    _existing("--data", args.data, "dir")
    if args.testbed is None and args.data is None:
        raise ValueError("give --testbed DIR or --data DIR (the LACUNA data the probe and the attack read)")
    if args.budget is not None and args.budget not in ("forget", "all"):
        try:
            ok = int(args.budget) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--budget {args.budget!r}: use 'forget' (= |D_f|), 'all' or a row count >= 1")
    out = Path(args.out) if args.out else model.with_name(model.name + f"_attack_{args.protocol}")
    if out.exists() and not args.force:
        raise FileExistsError(f"--out {out} exists; pass --force to overwrite")
    _writable("--out", out, directory=True)
    return out


def _check_diagnose(args: argparse.Namespace) -> Path:
    if args.queries in ("forget", "retain") and args.data is None and args.testbed is None:
        raise ValueError(f"--queries {args.queries} reads a LACUNA split: give --testbed DIR or --data DIR")
    _existing("--reference", args.reference, "dir")
    for path in args.updated:
        _existing("--updated", path, "dir")
    _testbed("--testbed", args.testbed)
    _existing("--data", args.data, "dir")
    if args.queries not in ("forget", "retain"):
        _existing("--queries", args.queries, "file")
    out = Path(args.out) if args.out else Path(args.updated[0]).with_name("lacuna_diagnose")
    _writable("--out", out, directory=True)
    return out


def _check_reversibility(args: argparse.Namespace) -> dict | None:
    """The three results paths, ``--out``; returns the parsed ``--diagnose`` JSON (None without it)."""
    import json

    for flag in ("original", "unlearned", "relearned"):
        _existing("--" + flag, getattr(args, flag))
    if args.out:
        _writable("--out", args.out, directory=False)
    if not args.diagnose:
        return None
    _existing("--diagnose", args.diagnose, "file")
    try:
        diag = json.loads(Path(args.diagnose).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--diagnose {args.diagnose}: not a JSON file: {exc}") from None
    if not isinstance(diag, dict) or not isinstance(diag.get("updated", []), list):
        raise ValueError(f"--diagnose {args.diagnose}: not a lacuna diagnose.json (no 'updated' list)")
    return diag


def _tasks_path(args: argparse.Namespace) -> int:
    from lacuna_tasks import tasks_dir

    print(tasks_dir())
    return 0


def _data_generate(args: argparse.Namespace) -> int:
    _writable("--out", args.out, directory=True)
    from lacuna_tasks.generate import generate_dataset

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
    _writable("--out", args.out, directory=True)
    from lacuna_unlearn.quickstart import run_demo

    out = run_demo(args.out, preset=args.preset, field=args.field, seed=args.seed)
    print(f"demo results in {out}")
    return 0


def _build_testbed(args: argparse.Namespace) -> int:
    _existing("--model", args.model, "dir")
    _writable("--out", args.out, directory=True)
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
    _check_score(args)
    from lacuna_metrics.localization import SCORES, LocalizationConfig
    from lacuna_metrics.report import markdown_summary
    from lacuna_metrics.score import score_to_dir

    if not args.no_frag:
        from lacuna_metrics.activations import check_target

        check_target(args.frag_target)
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
        qtile_ties=args.qtile_ties,
        **({"threads": args.threads} if args.threads is not None else {}),
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
        calib_fields=_calib_fields(args.calib_fields),
        frag=not args.no_frag,
        gamma=args.gamma,
        frag_target=args.frag_target,
        frag_min_coverage=args.frag_min_coverage,
        null=not args.no_null,
        null_tolerance=args.null_tolerance,
        calib_samples=args.calib_samples,
        cache_dir=args.activation_cache,
        config=config,
        progress=not args.quiet,
        allow_mask_mismatch=args.allow_mask_mismatch,
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
    out = _check_attack(args)
    from lacuna_unlearn.attacks import resurfacing_attack

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
    out = _check_diagnose(args)
    from lacuna_metrics.activations import calibration_texts
    from lacuna_metrics.diagnose import diagnose

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
    diag = _check_reversibility(args)
    import json

    from lacuna_metrics.manifest import write_json
    from lacuna_metrics.reversibility import accuracies_from_lm_eval, classify_regime

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
    _existing("--config", args.config, "file")
    out = _writable("--out", args.out or f"runs/{args.preset}", directory=True)
    from lacuna_metrics.report import run_markdown
    from lacuna_unlearn.run import load_run_config, run_benchmark

    overrides = _parse_overrides(args.set)
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    cfg = load_run_config(args.config, preset=args.preset, overrides=overrides)
    results = run_benchmark(out, cfg)
    print(run_markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'report.md'} and {out / 'plots'}/")
    return 0


def _seed_list(text: str) -> list[int]:
    """``--seeds 1,2,3``: distinct non-negative integers (argparse turns the ValueError into a one-line error)."""
    items = [t.strip() for t in text.split(",")]
    if not items or any(not t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated non-negative integers, got {text!r}")
    seeds = [int(t) for t in items]
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct, got {text!r}")
    return seeds


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
    parser = _Parser(prog="lacuna", description="lacuna-bench: measure whether unlearning erased it.")
    sub = parser.add_subparsers(dest="command", required=True)

    tasks = sub.add_parser("tasks", help="lm-eval task pack helpers")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    path = tasks_sub.add_parser("path", help="print the task YAML directory (for lm_eval --include_path)")
    path.set_defaults(func=_tasks_path)

    data = sub.add_parser("data", help="synthetic LACUNA data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    gen = data_sub.add_parser("generate", help="generate synthetic PANORAMA-style profiles and LACUNA QA splits")
    gen.add_argument("--profiles", type=_int_at_least(1), default=1200, help="number of profiles (LACUNA: 1200)")
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--out", required=True, help="output directory (must be new or a previous dataset)")
    gen.add_argument(
        "--people-per-field",
        type=_int_at_least(1),
        default=100,
        help="people per field on each side (forget and retain)",
    )
    gen.add_argument(
        "--validation-people",
        type=_int_at_least(0),
        default=100,
        help="validation people per side (email and licence fields)",
    )
    gen.add_argument(
        "--retain-eval-people",
        type=_int_at_least(0),
        default=0,
        help="held-out retain-eval people per field (retain side only; 0: no retain_eval split; docs/tasks.md)",
    )
    gen.set_defaults(func=_data_generate)

    tb = sub.add_parser("build-testbed", help="build a LACUNA testbed (masked PII injection with ground-truth masks)")
    from lacuna_unlearn.testbed_presets import PRESETS as TESTBED_PRESETS  # dataclasses only: cheap

    tb.add_argument("--preset", default="mini", choices=sorted(TESTBED_PRESETS))
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
    score.add_argument(
        "--calib-samples", type=_int_at_least(1), default=128, help="calibration sequences per side (FRAG: 128)"
    )
    score.add_argument("--gamma", type=_finite(0.0), default=1.0, help="FRAG retain penalty (FRAG's default 1)")
    score.add_argument(
        "--frag-target",
        default="all",
        help="weights FRAG scores: all (every block projection: attention, MLP, experts, routers; default), "
        "attention, mlp (MLP and experts), expert, linear (every nn.Linear/Conv1D but lm_head and embeddings) or "
        "regex:PATTERN "
        "(checkpoint tensor names); see docs/anatomy.md",
    )
    score.add_argument(
        "--frag-min-coverage",
        type=_finite(0.0, 1.0),
        default=None,
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
        type=_finite(0.0, 0.5),
        default=0.05,
        help="families whose null AUC leaves 0.5 ± this are excluded from the calibrated best (default 0.05)",
    )
    score.add_argument("--activation-cache", help="activation statistics cache (default: $LACUNA_CACHE or ~/.cache)")
    score.add_argument(
        "--scores", help="comma-separated scoring functions, 'composite' included (default: all applicable)"
    )
    score.add_argument(
        "--composite-samples", type=_int_at_least(0), default=2_000_000, help="composite subsample; 0 skips it"
    )
    score.add_argument(
        "--bins-bits", type=_int_at_least(1), default=20, help="histogram resolution beyond --exact-limit"
    )
    score.add_argument(
        "--exact-limit", type=_int_at_least(0), default=1 << 22, help="scalars scored exactly in memory per score"
    )
    score.add_argument(
        "--qtile-ties",
        choices=["average", "ordinal"],
        default="average",
        help="tied |delta| in qtile/crossfield: average ranks (default), or ordinal = index order as the release "
        "code (comparable with the paper, but ties become signal; docs/scoring.md)",
    )
    score.add_argument("--seed", type=int, default=42)
    score.add_argument(
        "--threads",
        type=_int_at_least(1),
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
    score.add_argument("--quiet", action="store_true", help="no progress bar")
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
    attack.add_argument("--field", default="email", choices=["email", "phone", "birth_city", "drivers_license"])
    attack.add_argument(
        "--protocol", default="relearn", choices=["relearn", "relearn_lora", "relearn_frag", "relearn_restricted"]
    )
    attack.add_argument("--source", help="relearn_split | retain | forget | forget_retain | unrelated")
    attack.add_argument("--budget", help="rows: 'forget' (= |D_f|, restricted relearning) or a count")
    attack.add_argument(
        "--attempts", type=_int_at_least(1), default=200, help="extraction prompts per person (Success@N)"
    )
    attack.add_argument("--batch-size", type=_int_at_least(1), default=32, help="probe generation batch size")
    from lacuna_tasks.normalize import JUDGES, SUCCESS_AT_N_JUDGE  # no torch: cheap

    attack.add_argument(
        "--judge",
        default=SUCCESS_AT_N_JUDGE,
        choices=list(JUDGES),
        help="leak rule of Success@N: lacuna (LACUNA's: lower-case containment in the whole 20 tokens; default, "
        "comparable with the paper), first_line (lacuna-bench's lm-eval rule), loose; attack.json keeps all three "
        "under by_judge (docs/tasks.md 'Judges')",
    )
    attack.add_argument("--seed", type=int, default=42)
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
    diag.add_argument("--n", type=_int_at_least(1), default=64, help="number of query texts")
    diag.add_argument("--pooling", default="masked_mean", choices=["masked_mean", "mean", "first", "last"])
    diag.add_argument("--max-length", type=_int_at_least(1), default=128)
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
    rev.add_argument("--field", default="email", choices=["email", "phone", "birth_city", "drivers_license"])
    rev.add_argument("--tau-rev", type=_finite(), default=0.5, help="reversible iff recovery ratio >= this")
    rev.add_argument("--tau-cat", type=_finite(), default=0.2, help="catastrophic iff retain drop > this")
    rev.add_argument("--relative", action="store_true", help="retain drop relative to the original accuracy")
    rev.add_argument("--diagnose", help="diagnose.json to attach as representation evidence")
    rev.add_argument("--out", help="write the result JSON here")
    rev.set_defaults(func=_reversibility)

    run = sub.add_parser(
        "run",
        help="the whole benchmark: testbed, unlearning methods, lm-eval, scores, attacks, regimes, report",
        description="Run (or resume from the stage cache) a declarative experiment; default: the mini preset.",
    )
    run.add_argument("--preset", default="mini", choices=["mini", "smoke"])
    run.add_argument("--config", help="YAML run config overriding the preset (fields, methods, probes)")
    run.add_argument("--set", action="append", default=[], help="dotted override, e.g. attack.attempts=50")
    run.add_argument(
        "--seeds",
        type=_seed_list,
        default=None,
        help="unlearning seeds, e.g. 1,2,3: every method once per seed, mean ± sd of every metric (docs/report.md)",
    )
    run.add_argument("--out", help="run directory (default: runs/PRESET); stages are cached in OUT/stages")
    run.set_defaults(func=_run)

    from lacuna_metrics import gate as gate_module  # argparse flags live with the gate logic

    gate = sub.add_parser(
        "gate",
        help="CI gate: pass/fail criteria over results.json, lm-eval results or score.json (exit 1 on failure)",
        description="Check thresholds (--max-leak, --min-auc, --check PATH<=X, ...); see docs/ci.md.",
    )
    gate_module.add_arguments(gate)
    gate.set_defaults(func=gate_module.run)
    return parser


class Terminated(SystemExit):
    """Raised by the SIGTERM handler: unwinds like Ctrl-C, so every ``OUT.partial`` is removed on the way out."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    import signal
    import threading

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from lacuna_metrics.threads import configure_threads

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
