"""What a worker does next: a pure reducer over its situation, like the membership reducer.

The training loop reports how its last step attempt ended and what the control thread has seen; `next_move`
answers with one move and its reason. An announcement from the coordinator becomes either a generation to
enter or one of the ways a worker's process ends (`ending_for`); every ending goes through the worker's one
exit path with the exit code decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

AttemptOutcome = Literal["none", "committed", "aborted", "failed"]
EndKind = Literal["complete", "left", "stopped", "job_failed", "coordinator_lost", "job_over", "control_failed"]

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_COORDINATOR_LOST = 3


@dataclass(frozen=True)
class Situation:
    committed: int  # optimizer steps committed by this replica
    total: int | None  # steps the loop asked for (None: the loop ends at a cursor, `cursor_goal`)
    attempt: AttemptOutcome  # how the last step attempt ended ("none": no attempt since the last move)
    superseded: bool  # the control thread saw a newer generation (or a Leave, a Stop, a lost coordinator)
    boundary_due: bool  # the last reduction carried a request to change membership at this boundary
    detail: str = ""  # why the attempt failed, when it did
    cursor: int = 0  # the committed position in the global sample stream
    cursor_goal: int | None = None  # the loop ends once the cursor reaches this (the end of an epoch)
    stop_asked: bool = False  # job.stop() on this rank, which is the whole job (standalone)

    def goal_reached(self) -> bool:
        if self.total is not None and self.committed >= self.total:
            return True
        return self.cursor_goal is not None and self.cursor >= self.cursor_goal


@dataclass(frozen=True)
class RunStep:
    reason: str


@dataclass(frozen=True)
class Recover:
    """Leave the current generation and join the next announced one (healing from peers if behind)."""

    reason: str
    patient: bool = False  # wait for the coordinator without asking it to re-form the group


@dataclass(frozen=True)
class CrossBoundary:
    """Report the step boundary and wait for the generation that starts after it."""

    reason: str


@dataclass(frozen=True)
class Finish:
    reason: str


Move = RunStep | Recover | CrossBoundary | Finish


def next_move(s: Situation) -> Move:
    if s.attempt == "failed":
        return Recover(s.detail or "a collective failed")
    if s.attempt == "aborted":
        return Recover(s.detail or "generation superseded during the step")
    if s.superseded:
        return Recover("generation superseded")
    if s.goal_reached():
        if s.total is not None and s.committed >= s.total:
            return Finish(f"{s.committed} of {s.total} steps committed")
        return Finish(f"cursor {s.cursor} reached {s.cursor_goal} after step {s.committed}")
    if s.stop_asked:
        return Finish(f"job.stop() after step {s.committed}")
    if s.boundary_due:
        return CrossBoundary(f"membership changes after step {s.committed}")
    if s.total is None:
        return RunStep(f"step {s.committed + 1} (cursor {s.cursor} of {s.cursor_goal})")
    return RunStep(f"step {s.committed + 1} of {s.total}")


@dataclass(frozen=True)
class Ending:
    """How this worker's process ends: the one exit path carries it out."""

    kind: EndKind
    code: int
    reason: str
    save_checkpoint: bool = False


def ending_for_stop(
    reason: str, error: str | None, *, rank: int, holds_state: bool, checkpoints: bool, sharded: bool = False
) -> Ending:
    """The coordinator stopped the job: finished, suspended (keep a disaster-recovery checkpoint) or failed.
    Rank 0 writes a replica's checkpoint; every rank writes its part of a sharded one."""
    if error is not None:
        return Ending("job_failed", EXIT_JOB_FAILED, f"job stopped: {error}")
    save = (rank == 0 or sharded) and holds_state and checkpoints  # a suspended job resumes from this file
    return Ending("stopped", EXIT_OK, f"job stopped: {reason}", save_checkpoint=save)


def ending_for_complete(reason: str) -> Ending:
    """Every member's loop ended at the same step (or a job.stop() ended them): the loop returns, and the
    script's code after it runs."""
    return Ending("complete", EXIT_OK, f"the job is complete: {reason}")


def ending_for_leave(reason: str) -> Ending:
    return Ending("left", EXIT_OK, f"left the job: {reason}")


def ending_for_lost_coordinator(detail: str) -> Ending:
    return Ending("coordinator_lost", EXIT_COORDINATOR_LOST, f"lost the coordinator: {detail}")


def ending_for_failed_control(reason: str) -> Ending:
    """A thread of the worker's control connection died: it leaves as a crash would (its agent may start
    it again, and it rejoins), having told the coordinator why."""
    return Ending("control_failed", EXIT_JOB_FAILED, f"the worker's control connection failed: {reason}")


def ending_for_refused_registration(reason: str) -> Ending:
    return Ending("job_over", EXIT_OK, f"the job is already over: {reason}")
