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

__all__ = ["LineProgress", "add_verbosity_arguments", "configure_logging", "progress", "verbosity_level"]

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


#: Seconds between two progress lines when stderr is no terminal (a log file, CI, ``nohup``).
PROGRESS_SECONDS_ENV = "LACUNA_PROGRESS_SECONDS"


def progress(iterable: Iterable[T] | None = None, **kwargs: Any) -> Iterator[T] | Any:
    """A progress report over ``iterable`` (or a manual one: ``total=``, ``.update(n)``), never under ``--quiet``:
    a tqdm bar on a terminal; elsewhere (a log file, CI, ``nohup``) one plain line every
    ``$LACUNA_PROGRESS_SECONDS`` (default 60) with the stage's name, the count done and an estimate of what
    remains, so a long stage is never silent. Work shorter than that prints nothing."""
    from tqdm.auto import tqdm

    quiet = _bars_enabled is False or kwargs.get("disable") is True
    if not quiet and not _is_terminal(sys.stderr):
        return LineProgress(iterable, **kwargs)
    if "disable" not in kwargs:
        kwargs["disable"] = True if quiet else None
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kwargs) if iterable is not None else tqdm(**kwargs)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class LineProgress:
    """tqdm's interface (iteration, ``update``, ``n``, ``set_postfix``, ``close``, a context manager) as one line
    on stderr every ``interval`` seconds: ``desc: 120/600 step (20%), 3m10s elapsed, ~12m40s left``."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str = "working",
                 unit: str = "it", unit_scale: bool = False, interval: float | None = None, **_: Any) -> None:  # fmt: skip
        import os
        import time

        self.iterable, self.desc, self.unit, self.n, self.unit_scale = iterable, desc, unit, 0, unit_scale
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        if interval is None:
            raw = os.environ.get(PROGRESS_SECONDS_ENV, "").strip()
            interval = float(raw) if raw else 60.0
        self.interval = interval
        self._clock = time.monotonic
        self.start = self._next = self._clock()
        self._next += interval
        self._postfix = ""
        self._printed = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        self._postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def update(self, n: float = 1) -> None:
        self.n += n
        if self._clock() >= self._next:
            self._next = self._clock() + self.interval
            self._emit()

    def close(self) -> None:
        if self._printed:  # a report that started gets its end; short work printed nothing
            self._printed = False
            self._emit(done=True)

    def _emit(self, done: bool = False) -> None:
        elapsed = self._clock() - self.start
        num = _si if self.unit_scale else (lambda v: f"{v:g}")
        count = num(self.n) + (f"/{num(self.total)}" if self.total else "") + f" {self.unit}"
        if self.total:
            count += f" ({100 * self.n / self.total:.0f}%)"
        line = f"{self.desc}: {count}, {_duration(elapsed)} elapsed"
        if not self._printed and not done:  # the first line says how many threads the work runs on
            torch = sys.modules.get("torch")
            threads = torch.get_num_threads() if torch is not None else None
            line += f" on {threads} thread{'' if threads == 1 else 's'}" if threads else ""
        if done:
            line += ", done"
        elif self.total and self.n:
            line += f", ~{_duration(elapsed * (self.total - self.n) / self.n)} left"
        if self._postfix:
            line += f", {self._postfix}"
        print(line, file=sys.stderr, flush=True)
        self._printed = not done


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _si(value: float) -> str:
    """``1234567`` as ``1.23M`` (the scale tqdm's ``unit_scale`` shows)."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:g}"
