"""The catalogue of the job's events that tools read back: one frozen type per kind.

The coordinator writes these kinds as their types (`EventLog.record`), and status, the demos, chaos, the
benchmarks and the tests read them back as the same types (`of_kind`, `EventsFile.of`), so a field is
named once, here. In `events.jsonl` each is one JSON line, `{"event": kind, "job": .., "time": .., fields}`.
Kinds no tool reads (a refused handshake, a worker's exit, ...) stay plain records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from slurm_elastic.errors import ElasticError

E = TypeVar("E", bound="Event")


class EventFormatError(ElasticError):
    """A record of a catalogued kind that lacks one of the kind's fields."""


@dataclass(frozen=True)
class Event:
    KIND: ClassVar[str]
    time: float = dataclasses.field(default=0.0, kw_only=True)  # set by the event log when written

    def fields(self) -> dict[str, Any]:
        """What is written after the event's kind (the log adds the job and the time); tuples as lists, as
        they read back from JSON."""
        return {
            f.name: list(value) if isinstance(value := getattr(self, f.name), tuple) else value
            for f in dataclasses.fields(self)
            if f.name != "time"
        }

    @classmethod
    def from_event(cls: type[E], record: Mapping[str, Any]) -> E:
        """From one record (a line of events.jsonl, or one kept in memory); fields it does not name are
        ignored, so a newer writer's additions do not break an older reader."""
        given: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in record:
                value = record[f.name]
                given[f.name] = tuple(value) if isinstance(value, list) else value
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise EventFormatError(f"a {cls.KIND} event without {f.name!r}: {dict(record)}"[:500])
        return cls(**given)


def of_kind(records: Iterable[Mapping[str, Any]], kind: type[E]) -> list[E]:
    """The records of one kind, as its type, in order."""
    return [kind.from_event(r) for r in records if r.get("event") == kind.KIND]


@dataclass(frozen=True)
class Commit(Event):
    """A committed step: as the coordinator recorded it (rank 0 told it), and as its `commit` event tells it."""

    KIND: ClassVar[str] = "commit"
    step: int
    generation: int
    world: int
    loss: float
    worker_time: float  # when rank 0 committed it (its clock)
    samples: int = 0  # (0 in a line written before samples were recorded)
    received: float = -1.0  # when the coordinator heard of it (its clock; -1: before it was recorded)

    @classmethod
    def from_event(cls, record: Mapping[str, Any]) -> Commit:
        commit = super().from_event(record)
        if commit.received < 0:  # a line written before `received` was: the worker's time
            commit = dataclasses.replace(commit, received=commit.worker_time)
        return commit


@dataclass(frozen=True)
class MembershipChange(Event):
    """The coordinator formed a generation: who is in it and why."""

    KIND: ClassVar[str] = "membership_change"
    generation: int
    cause: str
    world_before: int
    world: int
    ranks: tuple[str, ...]
    joined: tuple[str, ...]
    left: tuple[str, ...]
    boundary_step: int | None  # the step a graceful change waited for (None: an abrupt one)
    trigger: str  # the reducer's event that caused it


@dataclass(frozen=True)
class GenerationReady(Event):
    """A generation formed and in sync, as its rank 0 reported it (the last fields depend on the strategy)."""

    KIND: ClassVar[str] = "generation_ready"
    worker: str
    generation: int
    cause: str
    world: int
    form_s: float
    sync_s: float
    total_s: float
    resume_step: int
    receivers: tuple[int, ...]
    sources: tuple[int, ...]
    bytes: int  # moved by all ranks together
    transfer: str  # why the plan is what it is
    lost_committed_steps: int = 0  # committed steps before the change that the generation does not hold
    batch_policy: str = ""
    lr_factor: float = 1.0
    reduce_dtype: str | None = None  # replicated
    buckets: int | None = None  # replicated
    strategy: str | None = None  # "fsdp2" for a sharded job
    mirrors: bool | None = None  # sharded: every shard held twice
    shard_group: int | None = None  # sharded: ranks per shard group (HSDP)
    replica_groups: int | None = None  # sharded: shard groups


@dataclass(frozen=True)
class Recovered(Event):
    """The first step committed after an abrupt change."""

    KIND: ClassVar[str] = "recovered"
    generation: int
    step: int
    detect_to_commit_s: float
    last_step_before: int


@dataclass(frozen=True)
class CheckpointFallback(Event):
    """No survivor held the state: the job resumed from its disaster-recovery checkpoint."""

    KIND: ClassVar[str] = "checkpoint_fallback"
    last_committed_step: int
    resume_step: int
    replayed_steps: int


@dataclass(frozen=True)
class Progress(Event):
    KIND: ClassVar[str] = "progress"
    step: int
    loss: float
    world: int
    generation: int
    samples_per_s: float | None


@dataclass(frozen=True)
class NodeRegistered(Event):
    KIND: ClassVar[str] = "node_registered"
    node: str
    host: str
    nproc: int
    slurm_job: str | None


@dataclass(frozen=True)
class WorkerRegistered(Event):
    KIND: ClassVar[str] = "worker_registered"
    worker: str
    node: str
    pid: int
    committed_step: int


@dataclass(frozen=True)
class NodeLost(Event):
    """A node's agent connection closed while the job ran: its workers are lost with it."""

    KIND: ClassVar[str] = "node_lost"
    node: str
    workers: tuple[str, ...]


@dataclass(frozen=True)
class DrainRequested(Event):
    KIND: ClassVar[str] = "drain_requested"
    nodes: tuple[str, ...]
    mode: str
    reason: str
    source: str


CATALOGUE: tuple[type[Event], ...] = (
    Commit, MembershipChange, GenerationReady, Recovered, CheckpointFallback, Progress, NodeRegistered,
    WorkerRegistered, NodeLost, DrainRequested,
)  # fmt: skip

__all__ = [
    "CATALOGUE",
    "CheckpointFallback",
    "Commit",
    "DrainRequested",
    "Event",
    "EventFormatError",
    "GenerationReady",
    "MembershipChange",
    "NodeLost",
    "NodeRegistered",
    "Progress",
    "Recovered",
    "WorkerRegistered",
    "of_kind",
]
