"""The ``lacuna`` command: a thin dispatcher over one module per subcommand.

Each subcommand's module (:data:`COMMANDS`) holds ``PARSER`` (its ``add_parser`` keywords), ``add_arguments(parser)``
and ``run(args)``. The modules are imported when the parser is built, and each imports torch and the heavy parts of
the three packages only inside ``run``, so ``lacuna tasks path`` and the argument checks stay fast. Defaults and
choices come from their homes: the run and testbed configs and presets (``lacuna_unlearn/dataclass_config.py``),
``lacuna_tasks.schema.FIELDS``, ``lacuna_tasks.normalize.JUDGES``, the attack configs, the scorer's
``LocalizationConfig``. The up-front checks are in ``checks.py``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from lacuna_tasks import add_verbosity_arguments
from lacuna_unlearn.bench.cli.checks import Parser

#: subcommand -> the module holding its PARSER, add_arguments and run, in ``--help`` order.
COMMANDS: dict[str, str] = {
    "tasks": "lacuna_unlearn.bench.cli.tasks",
    "data": "lacuna_unlearn.bench.cli.data",
    "build-testbed": "lacuna_unlearn.bench.cli.build_testbed",
    "demo": "lacuna_unlearn.bench.cli.demo",
    "score": "lacuna_unlearn.bench.cli.score",
    "attack": "lacuna_unlearn.bench.cli.attack",
    "diagnose": "lacuna_unlearn.bench.cli.diagnose",
    "reversibility": "lacuna_unlearn.bench.cli.reversibility",
    "run": "lacuna_unlearn.bench.cli.run",
    "meta": "lacuna_unlearn.bench.cli.meta",
    "gate": "lacuna_unlearn.bench.gate.command",  # argparse flags live with the gate logic
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lacuna", description="lacuna-bench: measure whether unlearning erased it.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, **module.PARSER)
        module.add_arguments(command)
        if command.get_default("func") is None:  # commands with subcommands set ``func`` on their leaves
            command.set_defaults(func=module.run)
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

    from lacuna_tasks import configure_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    try:
        from lacuna_metrics import configure_threads

        configure_threads()  # OMP_NUM_THREADS if set, else every core (measured: docs/distributed.md "Threads")
    except ValueError as exc:
        print(f"lacuna: error: {exc}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    from lacuna_metrics import error_line

    try:
        return args.func(args)
    except Exception as exc:  # our errors name the file/field at fault, a file-system fault its file; else: a bug
        line = error_line(exc)
        if line is None:
            raise
        print(f"lacuna: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lacuna: interrupted; partial outputs removed", file=sys.stderr)
        return 130
    except Terminated as exc:
        print("lacuna: terminated (SIGTERM); partial outputs removed", file=sys.stderr)
        return int(exc.code or 143)


if __name__ == "__main__":
    sys.exit(main())
