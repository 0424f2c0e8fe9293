"""Logging: the library's loggers, whose lines never raise, and the set-up for entry points (the library
itself never configures logging).

A log line that cannot be written (stderr on a full disk, a closed stream, a broken pipe) must cost that
line, never the loop that wrote it: a coordinator's ticker that died on a full disk stopped pulsing, and
every agent then declared the coordinator lost. So every library module logs through `get_logger`, whose
calls drop such a line and count it, whatever the process's structlog set-up is (the worker's is the
user's script's, or structlog's default: stdout); the entry points' own sink drops the same way. Once a line
gets through again, one `log_lines_dropped` line says how many were lost, and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, TextIO

import structlog

from slurm_elastic.sanitize import printable

LogFormat = Literal["console", "json"]


def printable_fields(logger: object, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """Console lines carry text of peers, workers and the user's code (reasons, stderr tails, event names):
    its control characters are shown as escapes, never acted on by the terminal. JSON escapes them itself."""
    return {printable(str(k)): printable(v) if isinstance(v, str) else v for k, v in event.items()}


class Drops:
    """Log lines this process dropped: in all, and since the last one that got through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.last_error = ""
        self._since = 0
        self._first_error = ""

    def drop(self, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"[:300]
        with self._lock:
            self.total += 1
            self.last_error = error
            self._since += 1
            self._first_error = self._first_error or error

    def take(self) -> tuple[int, str] | None:
        """Lines dropped since the last one written, and the first error; None if none (reset once taken)."""
        with self._lock:
            if not self._since:
                return None
            taken = (self._since, self._first_error)
            self._since, self._first_error = 0, ""
            return taken

    def untake(self, taken: tuple[int, str]) -> None:
        """The note about `taken` could not be written either: it is still owed (the note now counts too)."""
        with self._lock:
            self._since += taken[0]
            self._first_error = taken[1]


DROPS = Drops()


class SafeLogger:
    """A structlog logger whose calls never raise: a line that cannot be written is dropped and counted.
    Each call says whether its line got through (False: dropped here or by the entry points' sink)."""

    def __init__(self, name: str) -> None:
        self._log = structlog.get_logger(name)

    def debug(self, event: str, **fields: Any) -> bool:
        return self._write("debug", event, fields)

    def info(self, event: str, **fields: Any) -> bool:
        return self._write("info", event, fields)

    def warning(self, event: str, **fields: Any) -> bool:
        return self._write("warning", event, fields)

    def error(self, event: str, **fields: Any) -> bool:
        return self._write("error", event, fields)

    def _write(self, level: str, event: str, fields: dict[str, Any]) -> bool:
        before = DROPS.total
        try:
            getattr(self._log, level)(event, **fields)
        except Exception as exc:  # a log line must never stop its caller, whatever the sink or its processors do
            DROPS.drop(exc)
            return False
        if DROPS.total != before:  # the entry points' sink dropped it (or another thread's line just now)
            return False
        self._report_drops()
        return True

    def _report_drops(self) -> None:
        """A line got through (or was filtered out by level): say once how many were dropped before it."""
        dropped = DROPS.take()
        if dropped is None:
            return
        before = DROPS.total
        try:
            self._log.warning("log_lines_dropped", count=dropped[0], first_error=dropped[1])
        except Exception as exc:
            DROPS.drop(exc)
        if DROPS.total != before:
            DROPS.untake(dropped)


def get_logger(name: str) -> SafeLogger:
    return SafeLogger(name)


class _SafeSink:
    """The entry points' sink: each rendered line to `file`; a line that cannot be written is dropped (and
    counted in DROPS)."""

    def __init__(self, file: TextIO) -> None:
        self._file = file
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self._lock:
            try:
                self._file.write(message + "\n")
                self._file.flush()
            except Exception as exc:  # OSError (ENOSPC, EPIPE), ValueError (a closed stream)
                DROPS.drop(exc)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _safe_sink(file: TextIO) -> Callable[..., _SafeSink]:
    sink = _SafeSink(file)
    return lambda *args: sink


def configure_logging(fmt: LogFormat = "console", level: str = "INFO") -> None:
    renderer: list[structlog.typing.Processor] = (
        [structlog.processors.JSONRenderer()]
        if fmt == "json"
        else [printable_fields, structlog.dev.ConsoleRenderer(colors=False)]
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=False),
            *renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=_safe_sink(sys.stderr),
        cache_logger_on_first_use=False,
    )


def drop_unwritable_output() -> None:
    """At an entry point's end: flush stdout and stderr, and point one that cannot be written (a full disk
    under the job's `.out`) at /dev/null, so that Python's own flush at exit drops the rest instead of
    turning a command that did its work into exit code 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as exc:
            DROPS.drop(exc)
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
