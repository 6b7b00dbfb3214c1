"""``lacuna attack``: relearning attack on an unlearned model, then the extraction probe before and after."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lacuna_tasks import FIELDS, JUDGES
from lacuna_unlearn.bench.cli.checks import (
    check_attack,
    int_at_least,
    one_value,
    set_key,
)
from lacuna_unlearn.bench.run_config import AttackConfig, EvalConfig, RunConfig
from lacuna_unlearn.dataclass_config import check_value, config_choices

#: keyword arguments of this subcommand's ``add_parser``
PARSER = dict(
    help="relearning attack on an unlearned model + extraction probe before/after (Success@N, resurfaced)",
    description=(
        "Relearn with a lacuna-unlearn attack preset, then probe both models (docs/definitions.md#relearning-attacks)."
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fields = list(FIELDS)
    parser.add_argument("--model", required=True, help="the unlearned HF checkpoint to attack")
    parser.add_argument("--testbed", help="testbed directory (data for the attack and the probe)")
    parser.add_argument("--data", help="LACUNA data directory (instead of --testbed)")
    parser.add_argument("--field", choices=fields, help=f"the field (default: {fields[0]})")
    parser.add_argument(
        "--protocol", choices=config_choices("attack"), help=f"attack preset (default: {AttackConfig.protocol})"
    )
    parser.add_argument("--source", help="relearn_split | retain | forget | forget_retain | unrelated")
    parser.add_argument("--budget", help="rows: 'forget' (= |D_f|, restricted relearning) or a count")
    parser.add_argument(
        "--attempts", type=int_at_least(1), default=AttackConfig.attempts, help="extraction prompts per person"
    )
    parser.add_argument(
        "--batch-size", type=int_at_least(1), default=EvalConfig.batch_size, help="probe generation batch size"
    )
    parser.add_argument(
        "--judge",
        default=AttackConfig.judge,
        choices=list(JUDGES),
        help="leak rule of Success@N: lacuna (LACUNA's: lower-case containment in the whole 20 tokens; default, "
        "comparable with the paper), first_line (lacuna-bench's lm-eval rule), loose; attack.json keeps all three "
        "under by_judge (docs/tasks.md 'Judges')",
    )
    parser.add_argument("--seed", type=int, help=f"relearning seed (default: {RunConfig.seed})")
    parser.add_argument(
        "--set", action="append", default=[], help="Hydra override, e.g. trainer.args.learning_rate=1e-5"
    )
    parser.add_argument("--out", help="output directory (default: MODEL_attack_PROTOCOL next to the model)")
    parser.add_argument("--force", action="store_true", help="overwrite --out")


#: the relearning run's settings this command also takes as flags: setting -> (flag, its ``args`` name)
FLAG_SETTINGS = {
    "model": ("--model", "model"),
    "testbed": ("--testbed", "testbed"),
    "data": ("--data", "data"),
    "field": ("--field", "field"),
    "attack": ("--protocol", "protocol"),
    "source": ("--source", "source"),
    "budget": ("--budget", "budget"),
    "seed": ("--seed", "seed"),
    "output_dir": ("--out", "out"),
    "force": ("--force", "force"),
}
_PATHS = ("model", "testbed", "data", "output_dir")


def settings_from_flags(args: argparse.Namespace) -> list[str]:
    """Apply the one rule between flags and ``--set`` (:func:`~lacuna_unlearn.bench.cli.checks.one_value`): a setting
    given both ways with different values is refused; given by ``--set`` alone, it fills its flag (``--set seed=3``
    is ``--seed 3``, so the probe, the output name and attack.json use it too). Returns the other ``--set`` items."""
    given = {}
    for key, (flag, dest) in FLAG_SETTINGS.items():
        value = getattr(args, dest)
        if value is None or value is False:
            continue
        given[key] = (flag if value is True else f"{flag} {value}", _as_setting(key, value))
    values = one_value(given, args.set, owned=FLAG_SETTINGS, paths=_PATHS)
    for key, value in values.items():
        if key not in given:
            typed = {"seed": int, "force": bool}.get(key)
            setattr(args, FLAG_SETTINGS[key][1], check_value(key, typed, value) if typed else str(value))
    args.field = args.field or next(iter(FIELDS))
    args.protocol = args.protocol or AttackConfig.protocol
    args.seed = RunConfig.seed if args.seed is None else args.seed
    return [item for item in args.set if set_key(item) not in FLAG_SETTINGS]


def _as_setting(key: str, value: Any) -> Any:
    """A flag's value as its ``--set`` twin reads: ``--budget 10`` is ``budget=10``, an integer."""
    return int(value) if key == "budget" and str(value).isdigit() else value


def run(args: argparse.Namespace) -> int:
    overrides = settings_from_flags(args)
    out = check_attack(args)
    from lacuna_unlearn.bench.attacks import resurfacing_attack

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
