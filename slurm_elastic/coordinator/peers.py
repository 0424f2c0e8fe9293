"""What the coordinator keeps about its peers and its progress, and what other threads may read of it (its
commits are the catalogue's `Commit`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from slurm_elastic.eventtypes import Commit


class PeerWriter(Protocol):
    """A peer's connection, as the coordinator writes to it: its own (asyncio.StreamWriter), or its node relay's
    (coordinator.relayed)."""

    def write(self, data: bytes) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...


@dataclass
class Peer:
    """A connected worker or agent."""

    writer: PeerWriter
    node: str
    last_seen: float
    step: int = -1
    phase: str = "init"
    phase_since: float = 0.0
    pid: int = 0
    slurm_job: str | None = None
    interface: str | None = None  # an agent's: its node's training groups use it (netif)
    assigned: int = 0  # the last generation whose assign it was sent: the next may come as a change of it
    generation: int = 0  # the generation of its last heartbeat (a worker's)


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
