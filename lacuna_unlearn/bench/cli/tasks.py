"""``lacuna tasks path``: where the task YAMLs are (for ``lm_eval --include_path``)."""

from __future__ import annotations

import argparse

PARSER = dict(help="lm-eval task pack helpers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", required=True)
    path = sub.add_parser("path", help="print the task YAML directory (for lm_eval --include_path)")
    path.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lacuna_tasks import tasks_dir

    print(tasks_dir())
    return 0
