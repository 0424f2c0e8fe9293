"""A node agent's phase: what it has been told and seen, as one value, and the exit code that follows.

The agent (slurm_elastic.agent) feeds every event here and acts on the result; nothing here has a clock,
a socket or a process. Phases are ordered by how badly the agent ends: an event never moves an agent to a
milder phase, so a late "all is well" cannot hide an earlier failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DRAINED_BY_SIGNAL = 75  # EX_TEMPFAIL: preempted or told to stop by Slurm; a satellite should requeue


class AgentPhase(enum.IntEnum):
    RUNNING = 0
    DRAINING = 1  # asked to leave at the next step boundary
    DRAINING_ON_SIGNAL = 2  # the same, because Slurm signalled this node (preemption, scancel, a shrink)
    STOPPED = 3  # the coordinator ended the job without an error
    FINISHED_BADLY = 4  # stopped without an error, but a worker failed afterwards: never a success
    STOPPED_WITH_ERROR = 5  # the coordinator ended the job with an error
    COORDINATOR_LOST = 6  # its connection closed, a send failed, its lease ran out, or a worker found it gone
    FAILED = 7  # one of the agent's own control threads died


EXIT_CODES = {
    AgentPhase.RUNNING: EXIT_OK,  # every worker ended by itself
    AgentPhase.DRAINING: EXIT_OK,
    AgentPhase.DRAINING_ON_SIGNAL: EXIT_DRAINED_BY_SIGNAL,
    AgentPhase.STOPPED: EXIT_OK,
    AgentPhase.FINISHED_BADLY: EXIT_FAILED,
    AgentPhase.STOPPED_WITH_ERROR: EXIT_FAILED,
    AgentPhase.COORDINATOR_LOST: EXIT_FAILED,
    AgentPhase.FAILED: EXIT_FAILED,
}


# --- what the agent sees ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signalled:
    """SIGTERM or SIGINT reached the agent."""

    name: str


@dataclass(frozen=True)
class DrainAsked:
    """Something other than a signal asks this node to leave at the next boundary."""

    reason: str


@dataclass(frozen=True)
class StopReceived:
    error: bool


@dataclass(frozen=True)
class HoldAsked:
    """The node goes back to Slurm by a shrink: once done, wait up to `hold_s` for Slurm to end the task."""

    hold_s: float


@dataclass(frozen=True)
class ConnectionClosed:
    """The coordinator's connection ended (after a Stop that is only the job ending)."""


@dataclass(frozen=True)
class CoordinatorGone:
    """A send failed, the lease ran out, or a worker exited because it found the coordinator silent."""

    how: str


@dataclass(frozen=True)
class WorkerFailed:
    """A worker exited non-zero on its own (not killed by us)."""

    worker: str
    returncode: int


@dataclass(frozen=True)
class ControlLoopDied:
    reason: str


AgentEvent = (
    Signalled
    | DrainAsked
    | StopReceived
    | HoldAsked
    | ConnectionClosed
    | CoordinatorGone
    | WorkerFailed
    | ControlLoopDied
)


@dataclass(frozen=True)
class AgentState:
    phase: AgentPhase = AgentPhase.RUNNING
    signalled: bool = False  # ends a hold for Slurm, whatever the phase
    drain_requested: bool = False  # by a signal or anyone else, whatever the phase: starts the drain's clock
    hold_s: float | None = None
    failure: str | None = None  # why a control thread died
    failed_after_end: tuple[str, ...] = ()  # workers that failed once the job had finished


@dataclass(frozen=True)
class Transition:
    state: AgentState
    report_drain: bool = False  # tell the coordinator this node is draining (once: the first request)


def _worse(state: AgentState, phase: AgentPhase) -> AgentPhase:
    return max(state.phase, phase)


def step(state: AgentState, event: AgentEvent) -> Transition:
    """The agent's next state after `event`."""
    match event:
        case Signalled():
            phase = _worse(state, AgentPhase.DRAINING_ON_SIGNAL)
            drained = replace(state, phase=phase, signalled=True, drain_requested=True)
            return Transition(drained, report_drain=not state.drain_requested)
        case DrainAsked():
            drained = replace(state, phase=_worse(state, AgentPhase.DRAINING), drain_requested=True)
            return Transition(drained, report_drain=not state.drain_requested)
        case StopReceived(error=error):
            phase = _worse(state, AgentPhase.STOPPED_WITH_ERROR if error else AgentPhase.STOPPED)
            return Transition(replace(state, phase=phase))
        case HoldAsked(hold_s=hold_s):
            return Transition(replace(state, hold_s=hold_s))
        case ConnectionClosed():
            if stop_received(state):
                return Transition(state)  # the job ended: closing is what comes next
            return Transition(replace(state, phase=_worse(state, AgentPhase.COORDINATOR_LOST)))
        case CoordinatorGone():
            return Transition(replace(state, phase=_worse(state, AgentPhase.COORDINATOR_LOST)))
        case WorkerFailed(worker=worker, returncode=code):
            if state.phase not in (AgentPhase.STOPPED, AgentPhase.FINISHED_BADLY):
                return Transition(state)  # a crash while training: the coordinator decides (restart, recover)
            ended = (*state.failed_after_end, f"{worker} exited with {code}")
            return Transition(replace(state, phase=AgentPhase.FINISHED_BADLY, failed_after_end=ended))
        case ControlLoopDied(reason=reason):
            return Transition(replace(state, phase=AgentPhase.FAILED, failure=state.failure or reason))
    raise TypeError(f"not an agent event: {event!r}")


def stop_received(state: AgentState) -> bool:
    return state.phase in (AgentPhase.STOPPED, AgentPhase.FINISHED_BADLY, AgentPhase.STOPPED_WITH_ERROR)


def stopping(state: AgentState) -> bool:
    """No worker is started or restarted any more."""
    return state.phase != AgentPhase.RUNNING


def drain_clock_runs(state: AgentState) -> bool:
    """Workers have `drain_grace_s` to leave from the first drain request or signal (a signal after a Stop
    too: a worker that hangs on its way out must not hold the node)."""
    return state.drain_requested


def ends_now(state: AgentState) -> bool:
    """The agent ends its workers at once, without waiting for them to leave by themselves."""
    return state.phase >= AgentPhase.STOPPED_WITH_ERROR


def reports(state: AgentState) -> bool:
    """Whether anything is still worth sending to the coordinator."""
    return state.phase != AgentPhase.COORDINATOR_LOST


def holds_for_slurm(state: AgentState) -> bool:
    """After its workers are done, does the agent wait for Slurm to end its task (a node given back by a
    shrink)? Only while nothing else ends it: a signal, a Stop, the coordinator gone, a failure."""
    return state.hold_s is not None and not state.signalled and state.phase < AgentPhase.STOPPED


def heartbeats(state: AgentState) -> bool:
    """Whether the agent still tells the coordinator it is alive (and watches the coordinator's lease)."""
    return state.phase < AgentPhase.STOPPED


def exit_code(state: AgentState) -> int:
    return EXIT_CODES[state.phase]


def requeues_job(state: AgentState, requeue_on_coordinator_loss: bool) -> bool:
    """A core job's agents requeue the Slurm job when its coordinator (on the batch host) vanished: under
    `--no-kill` Slurm would keep the job running without its batch script."""
    return requeue_on_coordinator_loss and state.phase == AgentPhase.COORDINATOR_LOST


@dataclass(frozen=True)
class RequeueVerdict:
    requeue: bool
    why: str


def requeue_verdict(
    *, coordinator_answers: bool, job_running: bool, batch_host_down: bool | None
) -> RequeueVerdict | None:
    """What an agent that lost its coordinator does now (None: ask again later). Silence alone cannot tell a
    dead batch host from one that only this node cannot reach, so Slurm decides: its controller reaches the
    batch host by another path. While Slurm still finds the batch host responding, this node is the one
    cut off (the coordinator evicts it and the job goes on); a requeue then would restart a healthy job."""
    if coordinator_answers:
        return RequeueVerdict(False, "the coordinator answers: this node was cut off")
    if not job_running:
        return RequeueVerdict(False, "Slurm is already ending or requeueing the job")
    if batch_host_down:
        return RequeueVerdict(True, "Slurm finds the batch host unresponsive too")
    return None
