"""Logging set-up for entry points (the library itself never configures logging)."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

from slurm_elastic.sanitize import printable

LogFormat = Literal["console", "json"]


def printable_fields(logger: object, method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    """Console lines carry text of peers, workers and the user's code (reasons, stderr tails, event names):
    its control characters are shown as escapes, never acted on by the terminal. JSON escapes them itself."""
    return {printable(str(k)): printable(v) if isinstance(v, str) else v for k, v in event.items()}


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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
