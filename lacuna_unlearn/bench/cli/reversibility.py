"""``lacuna reversibility``: the forgetting regime from lm-eval results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lacuna_tasks import FIELDS, NEUTRAL_PPL_TASK
from lacuna_unlearn.bench.cli.checks import (
    check_reversibility,
    finite,
)
from lacuna_unlearn.bench.run_config import RegimeConfig

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help=(
        "recovery ratio, catastrophic drop and the forgetting regime from lm-eval results "
        "(docs/definitions.md#forgetting-regimes)"
    )
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fields = list(FIELDS)
    parser.add_argument("--original", required=True, help="lm-eval results (file or --output_path dir), original model")
    parser.add_argument("--unlearned", required=True, help="lm-eval results of the unlearned model")
    parser.add_argument("--relearned", required=True, help="lm-eval results of the relearned model")
    parser.add_argument("--field", default=fields[0], choices=fields)
    parser.add_argument(
        "--rule",
        choices=["absolute", "relative"],
        default=RegimeConfig.rule,
        help="reversibility: absolute = the paper's gap (original - relearned forget leak < tau_rev); relative = "
        "recovery ratio >= tau_rev (default %(default)s)",
    )
    parser.add_argument(
        "--tau-rev",
        type=finite(0.0, 1.0, open_ends=True),
        default=RegimeConfig.tau_rev,
        help="reversibility threshold (%(default)s; see --rule)",
    )
    parser.add_argument(
        "--tau-cat",
        type=finite(0.0, 1.0, open_ends=True),
        default=RegimeConfig.tau_cat,
        help="catastrophic iff held-out retain or cross-field accuracy drops by more than this (%(default)s)",
    )
    parser.add_argument(
        "--tau-ppl",
        type=finite(1.0, open_ends=True),
        default=RegimeConfig.tau_ppl,
        help="... or the held-out neutral perplexity grows by more than this factor (%(default)s)",
    )
    parser.add_argument("--relative", action="store_true", help="accuracy drops relative to the original accuracy")
    parser.add_argument("--diagnose", help="diagnose.json to attach as representation evidence")
    parser.add_argument("--out", help="write the result JSON here")


def run(args: argparse.Namespace) -> int:
    diag = check_reversibility(args)

    from lacuna_metrics import accuracies_from_lm_eval, classify_regime, write_json

    forget_task, retain_task = f"lacuna_{args.field}_forget_qa", f"lacuna_{args.field}_retain_qa"
    paths = {"original": args.original, "unlearned": args.unlearned, "relearned": args.relearned}
    acc = {name: accuracies_from_lm_eval(path, forget_task, retain_task) for name, path in paths.items()}
    # the catastrophic axis reads only what no unlearning loss trained on (docs/definitions.md#forgetting-regimes)
    optional = {
        "retain_eval_accuracy": (f"lacuna_{args.field}_retain_eval_qa", "accuracy"),
        "crossfield_accuracy": (f"lacuna_{args.field}_crossfield_qa", "accuracy"),
    }
    retained = {k: (_optional(args.original, *t), _optional(args.unlearned, *t)) for k, t in optional.items()}
    ppl = [_optional(paths[k], NEUTRAL_PPL_TASK, "word_perplexity") for k in ("original", "unlearned")]
    ratio = ppl[1] / ppl[0] if None not in ppl and ppl[0] else None
    result = classify_regime(
        acc["original"][0], acc["unlearned"][0], acc["relearned"][0], retained=retained, ppl_ratio=ratio,
        tau_rev=args.tau_rev, tau_cat=args.tau_cat, tau_ppl=args.tau_ppl, rule=args.rule, relative=args.relative,
    )  # fmt: skip
    result["accuracies"] = {k: {"forget": v[0], "retain (trained on; not read)": v[1]} for k, v in acc.items()}
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


def _optional(path: str, task: str, metric: str) -> float | None:
    """``metric`` of ``task`` in lm-eval results ``path`` (None when that task was not evaluated)."""
    from lacuna_tasks import metric_value, read_lm_eval_results

    _file, doc = read_lm_eval_results(path)
    entry = (doc.get("results") or {}).get(task)
    value = metric_value(entry, metric) if entry is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
