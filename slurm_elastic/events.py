"""Structured job events: one structlog line each, kept in memory for `status`, and appended to the
job's `events.jsonl` for tools (demo, benchmarks) that read what happened."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from slurm_elastic.errors import ElasticError

log = structlog.get_logger("slurm_elastic")


class EventLog:
    def __init__(self, job_id: str, path: Path | None = None, keep: int = 500) -> None:
        self.job_id = job_id
        self.path = path
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._failing = False  # the last write to the file failed (reported once until one succeeds)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, kind: str, *, quiet: bool = False, **fields: Any) -> dict[str, Any]:
        record = {"event": kind, "job": self.job_id, "time": round(time.time(), 4), **fields}
        with self._lock:
            self._recent.append(record)
            failure = self._append(record)
            if failure is not None:  # a full disk must not stop the caller (the coordinator's ticker, say)
                self._recent.append({"event": "events_write_failed", "job": self.job_id, **failure})
        if not quiet:
            log.info(kind, job=self.job_id, **fields)
        if failure is not None:
            log.error("events_write_failed", job=self.job_id, **failure)
        return record

    def _append(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Append to the file; the first failure of a run of failures is returned, to be reported once."""
        if self.path is None:
            return None
        try:
            with open(self.path, "a", opener=_append_no_follow) as fh:
                fh.write(json.dumps(record, default=str) + "\n")
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


def _append_no_follow(path: str, flags: int) -> int:
    # A planted symbolic link in the job's directory never makes the job append to another file.
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


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

    def world(self) -> int:
        changes = self.events("membership_change")
        return int(changes[-1]["world"]) if changes else 0

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise ElasticError(f"{self.label}: timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.2)
