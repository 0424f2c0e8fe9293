"""What the coordinator keeps about its peers and its progress, and what other threads may read of it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Peer:
    """A connected worker or agent."""

    writer: asyncio.StreamWriter
    node: str
    last_seen: float
    step: int = -1
    phase: str = "init"
    phase_since: float = 0.0
    pid: int = 0
    slurm_job: str | None = None


@dataclass(frozen=True)
class Commit:
    """A committed step: as the coordinator recorded it, or as its `commit` event tells it."""

    step: int
    generation: int
    world: int
    loss: float
    samples: int
    worker_time: float  # when rank 0 committed it (its clock)
    received: float  # when the coordinator heard of it (its clock)

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Commit:
        """From a `commit` line of events.jsonl (one written before `samples` and `received` were: 0 and the
        worker's time)."""
        return cls(
            step=event["step"],
            generation=event["generation"],
            world=event["world"],
            loss=event["loss"],
            samples=event.get("samples", 0),
            worker_time=event["worker_time"],
            received=event.get("received", event["worker_time"]),
        )


@dataclass
class PublicView:
    """What other threads may read: copied under a lock."""

    phase: str = "rendezvous"
    generation: int = 0
    world: int = 0
    last_step: int = 0
    reason: str = ""
    failure_traceback: str | None = None
    commits: list[Commit] = field(default_factory=list)
    failed_after_training: list[str] = field(default_factory=list)  # finished training, then exited non-zero


def throughput(commits: Sequence[Commit]) -> float | None:
    """Samples per second over recent commits, by the workers' own clocks."""
    if len(commits) < 2 or commits[-1].worker_time <= commits[0].worker_time:
        return None
    samples = sum(c.samples for c in commits[1:])
    return round(samples / (commits[-1].worker_time - commits[0].worker_time), 1)
