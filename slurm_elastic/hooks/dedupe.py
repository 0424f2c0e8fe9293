"""The health check's memory between runs: which job was told about which node state, and when the
full checks last ran. It runs every HealthCheckInterval (as often as every second), so without this it
would tell a job about the same drain again and again.

`plan` and `after_notify` are pure; `StateFile` keeps the records in `<state_dir>/healthcheck.<node>.json`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "MAX_ATTEMPTS", "Claim", "NodeState", "Plan", "Record", "RunState", "StateFile", "after_notify", "mode_for", "plan",
]  # fmt: skip

NodeState = Literal["DRAIN", "FAIL"]
# A coordinator that does not answer is tried on this many runs, then left alone (it is probably gone).
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Record:
    attempts: int = 0
    done: bool = False


@dataclass(frozen=True)
class RunState:
    records: dict[str, Record] = field(default_factory=dict)  # "<job>:<state>" -> record
    last_full_check: float = 0.0


@dataclass(frozen=True)
class Plan:
    to_notify: tuple[tuple[str, Literal["boundary", "now"]], ...]
    records: dict[str, Record]


def mode_for(state: NodeState) -> Literal["boundary", "now"]:
    """FAIL: the node is expected to fail, leave now. DRAIN: leave at the next step boundary."""
    return "now" if state == "FAIL" else "boundary"


def _key(job: str, state: NodeState) -> str:
    return f"{job}:{state}"


def plan(node_state: NodeState | None, jobs: Iterable[str], records: dict[str, Record]) -> Plan:
    """Which jobs on this node to tell now, and the records to keep.

    A node back in service forgets everything, so that a later drain is told again; records of jobs
    that left the node, or of an earlier state (DRAIN, then FAIL), are dropped.
    """
    if node_state is None:
        return Plan((), {})
    keep: dict[str, Record] = {}
    todo: list[tuple[str, Literal["boundary", "now"]]] = []
    for job in sorted(set(jobs), key=lambda j: (len(j), j)):
        record = records.get(_key(job, node_state), Record())
        keep[_key(job, node_state)] = record
        if not record.done and record.attempts < MAX_ATTEMPTS:
            todo.append((job, mode_for(node_state)))
    return Plan(tuple(todo), keep)


def after_notify(records: dict[str, Record], job: str, state: NodeState, done: bool) -> dict[str, Record]:
    """Count one attempt; `done` when the job got the news or needs none (not elastic)."""
    old = records.get(_key(job, state), Record())
    return {**records, _key(job, state): Record(old.attempts + 1, old.done or done)}


@dataclass(frozen=True)
class Claim:
    held: bool
    holder_until: float  # when the lock's holder meant to be done (wall time; 0 if it did not say)

    def overran(self, now: float, grace_s: float) -> bool:
        """Held by another run that is `grace_s` past the time it meant to be done by."""
        return not self.held and now - self.holder_until > grace_s


class StateFile:
    """`healthcheck.<node>.json` and its lock in a root-only directory."""

    def __init__(self, state_dir: Path, node: str) -> None:
        self.dir = state_dir
        self.path = state_dir / f"healthcheck.{node}.json"
        self.lock_path = state_dir / f"healthcheck.{node}.lock"

    @contextlib.contextmanager
    def locked(self, until: float = 0.0) -> Iterator[Claim]:
        """This run's claim on the node's lock. The holder records `until`, the wall time by which it means
        to be done, so that a run finding the lock held can tell a watching run from one that overran."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder_until = float(os.pread(fd, 64, 0).decode() or 0.0)
                except ValueError:
                    holder_until = 0.0
                yield Claim(False, holder_until)
                return
            os.ftruncate(fd, 0)
            os.pwrite(fd, repr(until).encode(), 0)
            yield Claim(True, until)
        finally:
            os.close(fd)

    def load(self) -> RunState:
        """The saved state; a missing or damaged file is an empty state (at worst one repeated notice)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as fh:
                raw = json.load(fh)
            records = {
                str(k): Record(int(v["attempts"]), bool(v["done"])) for k, v in dict(raw.get("records", {})).items()
            }
            return RunState(records, float(raw.get("last_full_check", 0.0)))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return RunState()

    def save(self, state: RunState) -> None:
        data = {
            "records": {k: {"attempts": r.attempts, "done": r.done} for k, r in state.records.items()},
            "last_full_check": state.last_full_check,
        }
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.path)
