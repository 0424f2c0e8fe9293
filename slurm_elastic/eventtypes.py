"""The catalogue of what the job says in its events: one frozen type per kind.

The coordinator and the Slurm launcher write these kinds only as their types (`EventLog.record`), and the
demos, chaos, the benchmarks, `reclaim` and the tests read them back as the same types (`of_kind`,
`EventsFile.of`), so a field is named once, here; `status` tells each as its type's `summary` (`summarize`).
In `events.jsonl` each is one JSON line, `{"event": kind, "job": .., "time": .., fields}`.
Plain records remain for what has no fixed fields: the refused handshakes' summary (a count per category),
the reports a worker forwards (`shard_refused`, `ledger_failed`, `checkpoint_failed`, ...) and the event log's
own write failures.
"""

from __future__ import annotations

import contextlib
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

    def summary(self) -> str:
        """One line for a person (`slurm-elastic status`); by default the scalar fields as name=value."""
        return _scalars(self.fields())

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


def _scalars(fields: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and not isinstance(v, list | tuple | dict))


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

    def summary(self) -> str:
        moved = "".join(
            f"; {what} {', '.join(who)}" for what, who in (("left", self.left), ("joined", self.joined)) if who
        )
        return f"generation {self.generation}: world {self.world_before} -> {self.world} ({self.cause}){moved}"


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

    def summary(self) -> str:
        return (
            f"generation {self.generation} in sync after {self.total_s:.3f} s: world {self.world}, from step "
            f"{self.resume_step}, {self.lost_committed_steps} committed steps lost; {self.transfer}"
        )


@dataclass(frozen=True)
class Recovered(Event):
    """The first step committed after an abrupt change."""

    KIND: ClassVar[str] = "recovered"
    generation: int
    step: int
    detect_to_commit_s: float
    last_step_before: int
    # A peer lost to silence (a cut link, a frozen node): from the last frame it sent to this commit, i.e.
    # the cut to the next committed step, give or take one heartbeat. None: the fault was seen at once.
    silent_to_commit_s: float | None = None

    def summary(self) -> str:
        text = f"generation {self.generation} committed step {self.step} {self.detect_to_commit_s:.3f} s after"
        text += " the fault"
        if self.silent_to_commit_s is not None:
            text += f", {self.silent_to_commit_s:.3f} s after the silent peer's last word"
        return text


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
    interface: str | None = None  # the one its training groups use (netif)


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

    def summary(self) -> str:
        return f"{self.node} lost, with {', '.join(self.workers) or 'no worker'}"


@dataclass(frozen=True)
class DrainRequested(Event):
    KIND: ClassVar[str] = "drain_requested"
    nodes: tuple[str, ...]
    mode: str
    reason: str
    source: str

    def summary(self) -> str:
        return f"{', '.join(self.nodes)} to leave ({self.mode}, from the {self.source}): {self.reason}"


@dataclass(frozen=True)
class CoordinatorStarted(Event):
    KIND: ClassVar[str] = "coordinator_started"
    address: str
    expected_workers: int
    recovery: str


@dataclass(frozen=True)
class SlurmJobStarted(Event):
    """The Slurm batch script's launcher (re)started the job: once per run, requeues included."""

    KIND: ClassVar[str] = "slurm_job_started"
    slurm_job: str
    nodes: tuple[str, ...]
    restart_count: int


@dataclass(frozen=True)
class WorkerExited(Event):
    KIND: ClassVar[str] = "worker_exited"
    worker: str
    node: str
    returncode: int
    will_restart: bool
    stderr_tail: str | None


@dataclass(frozen=True)
class UserFailure(Event):
    """An exception in the user's code, reported with its signature; `count` of that signature so far."""

    KIND: ClassVar[str] = "user_failure"
    worker: str
    signature: str
    count: int


@dataclass(frozen=True)
class CollectiveFault(Event):
    """A worker's collective failed and no new generation came (it asks for one)."""

    KIND: ClassVar[str] = "collective_fault"
    worker: str
    generation: int
    detail: str


@dataclass(frozen=True)
class StateLost(Event):
    """A worker found that no live peer holds part of the state (a sharded job's last resort: the checkpoint)."""

    KIND: ClassVar[str] = "state_lost"
    worker: str
    generation: int
    detail: str


@dataclass(frozen=True)
class NodeUnresponsive(Event):
    KIND: ClassVar[str] = "node_unresponsive"
    node: str
    reason: str


@dataclass(frozen=True)
class PeersUnreachable(Event):
    """After a collective fault, member nodes tried to connect to each other (`probe`): the pairs that failed
    (`from>to`) and the nodes evicted for them (none: the group is re-formed as it was)."""

    KIND: ClassVar[str] = "peers_unreachable"
    generation: int
    nodes: int  # probed
    failing: tuple[str, ...]
    evicted: tuple[str, ...]
    seconds: float

    def summary(self) -> str:
        pairs = ", ".join(self.failing[:6]) + (" ..." if len(self.failing) > 6 else "")
        if not self.evicted:
            return f"generation {self.generation}: all {self.nodes} nodes reach each other; re-forming"
        return f"generation {self.generation}: {pairs} unreachable; evicted {', '.join(self.evicted)}"


@dataclass(frozen=True)
class NodeReadmitted(Event):
    """A node evicted as unreachable reaches every member again: its waiting workers may join."""

    KIND: ClassVar[str] = "node_readmitted"
    node: str
    workers: tuple[str, ...]
    held_s: float


@dataclass(frozen=True)
class HangEvicted(Event):
    KIND: ClassVar[str] = "hang_evicted"
    worker: str
    cause: str
    reason: str


@dataclass(frozen=True)
class RestartAll(Event):
    """Every worker is restarted from the disaster-recovery checkpoint."""

    KIND: ClassVar[str] = "restart_all"
    reason: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class JobFinished(Event):
    KIND: ClassVar[str] = "job_finished"
    reason: str
    step: int


@dataclass(frozen=True)
class JobSuspended(Event):
    """The whole job stops after a checkpoint, to be requeued (preemption, a time limit)."""

    KIND: ClassVar[str] = "job_suspended"
    reason: str
    step: int


@dataclass(frozen=True)
class JobCancelled(Event):
    """The person who started the job stopped it (Ctrl-C, a SIGTERM to the launcher): not a failure."""

    KIND: ClassVar[str] = "job_cancelled"
    reason: str
    step: int


@dataclass(frozen=True)
class JobFailed(Event):
    KIND: ClassVar[str] = "job_failed"
    reason: str


@dataclass(frozen=True)
class CoordinatorPaused(Event):
    """The coordinator's own loop stalled (a SIGSTOP, a suspended job): leases were extended, no one evicted."""

    KIND: ClassVar[str] = "coordinator_paused"
    seconds: float


@dataclass(frozen=True)
class AgentRelaunched(Event):
    KIND: ClassVar[str] = "agent_relaunched"
    node: str
    slurm_job: str
    attempt: int


@dataclass(frozen=True)
class AgentRelaunchGivenUp(Event):
    KIND: ClassVar[str] = "agent_relaunch_given_up"
    node: str
    slurm_job: str
    reason: str


@dataclass(frozen=True)
class MessageDropped(Event):
    """A peer's message the coordinator could not act on: dropped, the connection kept."""

    KIND: ClassVar[str] = "message_dropped"
    sender: str
    reason: str


@dataclass(frozen=True)
class KeepPending(Event):
    """A pending grow job is kept waiting for freed nodes."""

    KIND: ClassVar[str] = "keep_pending"
    count: int
    partition: str | None


@dataclass(frozen=True)
class ConnectionRefused(Event):
    KIND: ClassVar[str] = "connection_refused"
    reason: str
    peer: str


@dataclass(frozen=True)
class ControlLoopFailed(Event):
    """A control loop of the job died of an unexpected error: the coordinator's (`loop`) or a node agent's."""

    KIND: ClassVar[str] = "control_loop_failed"
    reason: str
    loop: str | None = None  # the coordinator's: connection, ticker, launcher
    node: str | None = None  # an agent's
    worker: str | None = None  # a worker's control thread


CATALOGUE: tuple[type[Event], ...] = (
    Commit, MembershipChange, GenerationReady, Recovered, CheckpointFallback, Progress, NodeRegistered,
    WorkerRegistered, NodeLost, DrainRequested, CoordinatorStarted, SlurmJobStarted, WorkerExited, UserFailure,
    CollectiveFault, StateLost, NodeUnresponsive, PeersUnreachable, NodeReadmitted, HangEvicted, RestartAll,
    JobFinished, JobSuspended, JobCancelled, JobFailed,
    CoordinatorPaused, AgentRelaunched, AgentRelaunchGivenUp, MessageDropped, KeepPending, ConnectionRefused,
    ControlLoopFailed,
)  # fmt: skip
CATALOGUED_KINDS = frozenset(kind.KIND for kind in CATALOGUE)
_BY_KIND = {kind.KIND: kind for kind in CATALOGUE}


def summarize(record: Mapping[str, Any]) -> str:
    """One line for a person of any record: a catalogued kind through its type's summary; a plain record,
    or one its writer got wrong, as its scalar fields."""
    kind = _BY_KIND.get(str(record.get("event")))
    if kind is not None:
        with contextlib.suppress(EventFormatError, TypeError, ValueError):
            return kind.from_event(record).summary()
    return _scalars({k: v for k, v in record.items() if k not in ("event", "job", "time")})


__all__ = [
    "CATALOGUE",
    "CATALOGUED_KINDS",
    "AgentRelaunchGivenUp",
    "AgentRelaunched",
    "CheckpointFallback",
    "CollectiveFault",
    "Commit",
    "ConnectionRefused",
    "ControlLoopFailed",
    "CoordinatorPaused",
    "CoordinatorStarted",
    "DrainRequested",
    "Event",
    "EventFormatError",
    "GenerationReady",
    "HangEvicted",
    "JobFailed",
    "JobFinished",
    "JobSuspended",
    "KeepPending",
    "MembershipChange",
    "MessageDropped",
    "NodeLost",
    "NodeReadmitted",
    "NodeRegistered",
    "NodeUnresponsive",
    "PeersUnreachable",
    "Progress",
    "Recovered",
    "RestartAll",
    "SlurmJobStarted",
    "StateLost",
    "UserFailure",
    "WorkerExited",
    "WorkerRegistered",
    "of_kind",
    "summarize",
]
