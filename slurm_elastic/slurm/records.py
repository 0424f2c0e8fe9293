"""Typed, version-independent records of what Slurm reports about jobs, nodes and itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import total_ordering

from slurm_elastic.errors import SlurmParseError

__all__ = [
    "JOB_ACTIVE_STATES",
    "JOB_BASE_STATES",
    "JOB_TERMINAL_STATES",
    "JobInfo",
    "NodeInfo",
    "SlurmVersion",
]

JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
JOB_TERMINAL_STATES = frozenset(JOB_BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"})
JOB_ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED"})

# The node base states of slurm.h (NODE_STATE_BASE); everything else in a state string is a flag.
NODE_BASE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"})


@total_ordering
@dataclass(frozen=True)
class SlurmVersion:
    """`slurm 22.05.8` -> SlurmVersion(22, 5, 8); compares as a tuple."""

    major: int
    minor: int
    micro: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.micro)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SlurmVersion):
            return NotImplemented
        return self.as_tuple() < other.as_tuple()

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """Accept `slurm 24.11.1`, `24.11.1`, `slurm-wlm 22.05.8` and `23.02.0-0rc1`."""
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if m is None:
            raise SlurmParseError(f"cannot read a Slurm version from {text.strip()!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as any backend reports it.

    `state` is Slurm's own one-word state as `squeue`/`scontrol` print it: a base state (RUNNING,
    PENDING, ...) or, while one is set, the most telling flag (COMPLETING, REQUEUED, RESIZING, ...).
    `base_state` is the base state where the source tells it (JSON lists do; text may hide it behind
    a flag), and `flags` holds every state flag that was reported.
    """

    job_id: str
    name: str = ""
    user: str = ""
    state: str = "PENDING"
    base_state: str | None = None
    flags: frozenset[str] = field(default_factory=frozenset)
    partition: str = ""
    nodes: tuple[str, ...] = ()
    num_nodes: int = 0
    batch_host: str | None = None
    restart_count: int = 0
    work_dir: str = ""
    comment: str = ""
    reason: str = ""
    time_limit_minutes: int | None = None  # None: no limit (or not reported)
    submit_time: datetime | None = None
    start_time: datetime | None = None
    array_job_id: str | None = None
    array_task_id: str | None = None
    het_job_id: str | None = None
    het_job_offset: int | None = None

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING" or (self.base_state == "PENDING" and not self.is_finished)

    @property
    def is_running(self) -> bool:
        return self.base_state == "RUNNING" or self.state in {"RUNNING", "CONFIGURING", "RESIZING"}

    @property
    def is_finished(self) -> bool:
        """True once the job has ended for good in this incarnation (a requeued job may come back)."""
        if self.state in JOB_TERMINAL_STATES:
            return True
        return self.base_state in JOB_TERMINAL_STATES and "COMPLETING" not in self.flags


@dataclass(frozen=True)
class NodeInfo:
    """One node: Slurm's base state (IDLE, ALLOCATED, MIXED, DOWN, ...) and its flags (DRAIN, ...)."""

    name: str
    state: str
    flags: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def drain(self) -> bool:
        """An admin or a health check asked that no new work lands here."""
        return "DRAIN" in self.flags

    @property
    def draining(self) -> bool:
        """Drain requested while jobs still run (sinfo's `draining`)."""
        busy = self.state in {"ALLOCATED", "MIXED"} or "COMPLETING" in self.flags
        return self.drain and busy

    @property
    def drained(self) -> bool:
        """Drain requested and no job left (sinfo's `drained`)."""
        return self.drain and not self.draining

    @property
    def down(self) -> bool:
        return self.state == "DOWN" or "NOT_RESPONDING" in self.flags or "FAIL" in self.flags

    @property
    def usable(self) -> bool:
        """Slurm may place new work here."""
        blocked = {"DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
        blocked |= {"POWERED_DOWN", "POWERING_DOWN", "INVALID_REG"}
        return self.state in {"IDLE", "MIXED", "ALLOCATED"} and not (self.flags & blocked)
