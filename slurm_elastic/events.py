"""Structured job events: one structlog line each, kept in memory for `status`, and appended to the
job's `events.jsonl` for tools (demo, benchmarks) that read what happened.

Neither write may stop the caller (the coordinator's ticker, say): a full disk under the file or under
stderr costs those lines, never the event in memory, and each failure is recorded there once
(`events_write_failed`, `log_write_failed`) until writing works again."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_elastic.eventtypes import E, Event, MembershipChange, of_kind
from slurm_elastic.logs import DROPS, get_logger
from slurm_elastic.waiting import wait_until

log = get_logger("slurm_elastic")


class EventLog:
    def __init__(self, job_id: str, path: Path | None = None, keep: int = 500) -> None:
        self.job_id = job_id
        self.path = path
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._failing = False  # the last write to the file failed (reported once until one succeeds)
        self._log_failing = False  # the last log line failed (reported once until one gets through)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, kind: str, *, quiet: bool = False, **fields: Any) -> dict[str, Any]:
        record = {"event": kind, "job": self.job_id, "time": round(time.time(), 4), **fields}
        self._keep(record)
        if not quiet:
            written = log.info(kind, job=self.job_id, **fields)
            if not written and not self._log_failing:  # stderr on a full disk, say: once per run of failures
                error = DROPS.last_error
                self._keep({"event": "log_write_failed", "job": self.job_id, "time": record["time"], "error": error})
            self._log_failing = not written
        return record

    def record(self, event: Event, *, quiet: bool = False) -> dict[str, Any]:
        """One event of the catalogue (`eventtypes`), written as its type's fields."""
        return self.emit(event.KIND, quiet=quiet, **event.fields())

    def _keep(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._recent.append(record)
            failure = self._append(record)
            if failure is not None:
                self._recent.append({"event": "events_write_failed", "job": self.job_id, **failure})
        if failure is not None:
            log.error("events_write_failed", job=self.job_id, **failure)

    def _append(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Append to the file; the first failure of a run of failures is returned, to be reported once."""
        if self.path is None:
            return None
        try:
            _append_line(self.path, json.dumps(record, default=str) + "\n")
        except OSError as exc:
            first = not self._failing
            self._failing = True
            return {"path": str(self.path), "error": str(exc), "lost": record["event"]} if first else None
        self._failing = False
        return None

    def recent(self, n: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._recent)[-n:]

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._recent)


def _append_line(path: Path, line: str) -> None:
    """Append one whole line, or nothing: a write cut short by a full disk is cut off again, so that no
    torn line breaks the file for its readers (the next event would have been glued onto it)."""
    # A planted symbolic link in the job's directory never makes the job append to another file.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size  # only this EventLog appends, under its lock
        data = memoryview(line.encode())
        try:
            while data:
                data = data[os.write(fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class EventsFile:
    """A job's `events.jsonl`, for tools that watch a job from outside it (demos, benchmarks, tests)."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.path) if kind is None or e["event"] == kind]

    def of(self, kind: type[E]) -> list[E]:
        """The events of one catalogued kind, as its type."""
        return of_kind(read_events(self.path), kind)

    def world(self) -> int:
        changes = self.of(MembershipChange)
        return changes[-1].world if changes else 0

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 300.0) -> None:
        wait_until(predicate, timeout=timeout, what=f"{what} ({self.label})", poll=0.2)
