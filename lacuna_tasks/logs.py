"""Logging and progress bars for every ``lacuna`` command: one configuration, one bar helper.

Modules log through ``logging.getLogger(__name__)``; the CLI calls :func:`configure_logging` once with the
``--verbose`` / ``--quiet`` count, which also decides whether :func:`progress` draws bars. Lives in
``lacuna_tasks`` (the bottom package) so the scorer and the trainers share it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["add_verbosity_arguments", "configure_logging", "progress", "verbosity_level"]

T = TypeVar("T")

#: The root of every logger in this project's three packages.
_ROOT_LOGGERS = ("lacuna_tasks", "lacuna_metrics", "lacuna_unlearn")
_bars_enabled: bool | None = None  # None: tqdm decides (bars on a terminal only)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (not the stream of the first call), so a
    redirected or captured stderr (pytest, ``contextlib.redirect_stderr``) receives later records."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ assigns it; the property ignores it
        pass


class _Formatter(logging.Formatter):
    """Info as the bare message; warnings and errors as ``lacuna: warning: …`` so they stand out (and stay
    greppable) among a command's output."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"lacuna: {record.levelname.lower()}: {message}"
        return message


def verbosity_level(verbose: int = 0, quiet: int = 0) -> int:
    """Log level for ``-v``/``-q`` counts: INFO by default, DEBUG with ``-v``, WARNING with ``-q``, ERROR with
    ``-qq``."""
    steps = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)
    return steps[max(0, min(len(steps) - 1, 1 - verbose + quiet))]


def configure_logging(verbose: int = 0, quiet: int = 0) -> None:
    """Send this project's log records to stderr at the level of ``verbose``/``quiet``; quiet also hides the
    progress bars. Idempotent: calling it again only changes the level."""
    global _bars_enabled
    level = verbosity_level(verbose, quiet)
    for name in _ROOT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(_Formatter())
            logger.addHandler(handler)
            logger.propagate = False
    _bars_enabled = False if quiet else None


def add_verbosity_arguments(parser: Any) -> None:
    """Add ``-v/--verbose`` and ``-q/--quiet`` (both countable) to an argparse parser."""
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-v: debug)")
    parser.add_argument(
        "-q", "--quiet", action="count", default=0, help="less output: warnings only, no progress bars (-qq: errors)"
    )


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> Iterator[T] | Any:
    """A tqdm bar (``tqdm.auto``) over ``iterable`` with ``kwargs`` passed through; drawn only on a terminal and
    never under ``--quiet``. Without an iterable, returns a manual bar (``total=``, ``.update(n)``)."""
    from tqdm.auto import tqdm

    if "disable" not in kwargs:
        kwargs["disable"] = True if _bars_enabled is False else None
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs) if iterable is not None else tqdm(**kwargs)
