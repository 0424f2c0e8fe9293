"""One greppable line per hook action, to syslog (tag `slurm-elastic`), an optional log file, and stderr.

    slurm-elastic-hook epilog job=123 node=n3 action=notify result=ok duration_ms=12 mode=now

A value that is not a plain word is written as a JSON string, so a quote, a newline or an escape
sequence from a job's comment stays inside one line. Callers never pass the job's secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["HookLog", "format_line", "format_value"]

PREFIX = "slurm-elastic-hook"
LOG_FILE = "hooks.log"
_PLAIN = re.compile(r"[A-Za-z0-9_.,:/@+%=\[\]\-]+")
MAX_VALUE = 500


def format_value(value: Any) -> str:
    if isinstance(value, float):
        value = round(value, 3)
    text = str(value)
    if len(text) > MAX_VALUE:
        text = text[:MAX_VALUE] + "..."
    return text if _PLAIN.fullmatch(text) else json.dumps(text)


def format_line(hook: str, fields: dict[str, Any]) -> str:
    parts = [PREFIX, hook]
    parts += [f"{key}={format_value(value)}" for key, value in fields.items() if value is not None]
    return " ".join(parts)


class HookLog:
    """Writes the lines of one hook run; `job` and `node` are repeated on every line."""

    def __init__(
        self,
        hook: str,
        *,
        job: str | None = None,
        node: str | None = None,
        log_dir: str = "",
        use_syslog: bool = True,
        stream: IO[str] | None = None,
    ) -> None:
        self.hook = hook
        self.job = job
        self.node = node
        self.log_dir = log_dir
        self.use_syslog = use_syslog
        self.stream = stream if stream is not None else sys.stderr
        self.lines: list[str] = []

    def event(self, action: str, result: str, **fields: Any) -> str:
        head = {"job": self.job, "node": self.node, "action": action, "result": result}
        line = format_line(self.hook, {**head, **fields})
        self.lines.append(line)
        self._emit(line)
        return line

    def _emit(self, line: str) -> None:
        # slurmd may have closed our stderr; the other sinks still get the line.
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self.stream, flush=True)
        if self.use_syslog:
            try:
                import syslog

                syslog.openlog("slurm-elastic", syslog.LOG_PID, syslog.LOG_DAEMON)
                syslog.syslog(syslog.LOG_INFO, line)
            except OSError:
                pass
        if self.log_dir:
            self._append(Path(self.log_dir) / LOG_FILE, line)

    @staticmethod
    def _append(path: Path, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            # O_NOFOLLOW: a symlink planted in the log directory must not redirect root's writes.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, f"{stamp} {line}\n".encode())
            finally:
                os.close(fd)
        except OSError:
            pass
