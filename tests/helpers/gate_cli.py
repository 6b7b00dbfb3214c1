"""``lacuna gate`` driven in-process for the gate tests, with its log records on the stderr of the moment."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from lacuna_unlearn.bench.gate.command import add_arguments, run


class _Stderr(logging.Handler):
    """The gate's log records on the stderr of the moment (capsys), as ``lacuna``'s logging setup prints them
    (``%(message)s`` to stderr), whatever handlers an earlier test's CLI call left behind."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


def gate(*argv: Any) -> int:
    """``lacuna gate ARGV`` in this process: its exit code; output on the captured stdout/stderr."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    logger = logging.getLogger("lacuna_unlearn.bench.gate.command")
    handler, level, propagate = _Stderr(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        return run(p.parse_args([str(a) for a in argv]))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
