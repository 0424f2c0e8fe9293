"""The agent's phase (decide.agent): every phase under every event, the exit code of each way an agent
ends, and, for any sequence of events, the same verdicts as the flags the agent kept before (four
booleans, a Stop and a hold timer), which this reducer replaced.

Two deliberate differences from those flags, both for a second message the coordinator never sends: a
second Stop without an error does not erase the first's error, and an agent whose control thread died
does not wait for Slurm to end its task (it exits failed at once)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.agent import (
    EXIT_DRAINED_BY_SIGNAL,
    EXIT_FAILED,
    EXIT_OK,
    AgentEvent,
    AgentPhase,
    AgentState,
    ConnectionClosed,
    ControlLoopDied,
    CoordinatorGone,
    DrainAsked,
    HoldAsked,
    RequeueVerdict,
    Signalled,
    StopReceived,
    WorkerFailed,
    drain_clock_runs,
    ends_now,
    exit_code,
    heartbeats,
    holds_for_slurm,
    reports,
    requeue_verdict,
    requeues_job,
    step,
    stopping,
)

EVENTS: list[AgentEvent] = [
    Signalled("SIGTERM"),
    DrainAsked("test"),
    StopReceived(error=False),
    StopReceived(error=True),
    HoldAsked(30.0),
    ConnectionClosed(),
    CoordinatorGone("a send failed"),
    WorkerFailed("n1:0:0", 1),
    ControlLoopDied("boom"),
]


def run(*events: AgentEvent, state: AgentState | None = None) -> AgentState:
    state = state or AgentState()
    for event in events:
        state = step(state, event).state
    return state


# --- each way an agent ends -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "phase", "code"),
    [
        ((), AgentPhase.RUNNING, EXIT_OK),  # its workers ended by themselves
        ((StopReceived(False), ConnectionClosed()), AgentPhase.STOPPED, EXIT_OK),
        ((StopReceived(True),), AgentPhase.STOPPED_WITH_ERROR, EXIT_FAILED),
        ((Signalled("SIGTERM"),), AgentPhase.DRAINING_ON_SIGNAL, EXIT_DRAINED_BY_SIGNAL),
        ((Signalled("SIGTERM"), StopReceived(False)), AgentPhase.STOPPED, EXIT_OK),  # the job ended meanwhile
        ((DrainAsked("admin"),), AgentPhase.DRAINING, EXIT_OK),
        ((ConnectionClosed(),), AgentPhase.COORDINATOR_LOST, EXIT_FAILED),
        ((CoordinatorGone("its lease ran out"),), AgentPhase.COORDINATOR_LOST, EXIT_FAILED),
        ((StopReceived(False), WorkerFailed("n1:0:0", 3)), AgentPhase.FINISHED_BADLY, EXIT_FAILED),
        ((WorkerFailed("n1:0:0", 3),), AgentPhase.RUNNING, EXIT_OK),  # a crash in training: restarts decide
        ((ControlLoopDied("boom"), StopReceived(False)), AgentPhase.FAILED, EXIT_FAILED),
        ((StopReceived(False), CoordinatorGone("a send failed")), AgentPhase.COORDINATOR_LOST, EXIT_FAILED),
    ],
)
def test_each_way_an_agent_ends_has_its_phase_and_exit_code(
    events: tuple[AgentEvent, ...], phase: AgentPhase, code: int
) -> None:
    state = run(*events)
    assert state.phase == phase
    assert exit_code(state) == code


def test_every_phase_has_an_exit_code_and_only_clean_endings_succeed() -> None:
    for phase in AgentPhase:
        code = exit_code(AgentState(phase=phase))
        assert code in (EXIT_OK, EXIT_FAILED, EXIT_DRAINED_BY_SIGNAL)
        assert (code == EXIT_FAILED) == (phase >= AgentPhase.FINISHED_BADLY)


# --- every phase under every event ------------------------------------------------------------------------


@pytest.mark.parametrize(("phase", "event"), list(product(AgentPhase, EVENTS)))
def test_no_event_makes_an_agent_end_better_than_it_would_have(phase: AgentPhase, event: AgentEvent) -> None:
    before = AgentState(phase=phase)
    after = step(before, event).state
    assert after.phase >= before.phase
    if ends_now(before):
        assert ends_now(after)
    if stopping(before):
        assert stopping(after)
    if exit_code(before) == EXIT_FAILED:
        assert exit_code(after) == EXIT_FAILED


@pytest.mark.parametrize("event", EVENTS)
def test_a_failed_agent_stays_failed_with_its_first_reason(event: AgentEvent) -> None:
    failed = run(ControlLoopDied("first"))
    after = step(failed, event).state
    assert after.phase == AgentPhase.FAILED and after.failure == "first"


def test_a_drain_is_reported_once_whoever_asks_first() -> None:
    first = step(AgentState(), Signalled("SIGTERM"))
    assert first.report_drain
    assert not step(first.state, Signalled("SIGINT")).report_drain
    assert not step(first.state, DrainAsked("again")).report_drain
    asked = step(AgentState(), DrainAsked("admin"))
    assert asked.report_drain and not step(asked.state, Signalled("SIGTERM")).report_drain


def test_the_connection_closing_after_a_stop_is_the_job_ending_not_a_loss() -> None:
    for error in (False, True):
        stopped = run(StopReceived(error))
        assert run(ConnectionClosed(), state=stopped).phase == stopped.phase
    assert run(ConnectionClosed()).phase == AgentPhase.COORDINATOR_LOST


def test_only_a_lost_coordinator_requeues_and_only_when_configured() -> None:
    for phase in AgentPhase:
        state = AgentState(phase=phase)
        assert requeues_job(state, True) == (phase == AgentPhase.COORDINATOR_LOST)
        assert not requeues_job(state, False)


def test_a_node_given_back_waits_for_slurm_until_something_else_ends_it() -> None:
    held = run(HoldAsked(30.0))
    assert holds_for_slurm(held)
    assert not holds_for_slurm(AgentState())  # no hold asked
    for ending in (Signalled("SIGTERM"), StopReceived(False), ConnectionClosed(), ControlLoopDied("x")):
        assert not holds_for_slurm(run(ending, state=held)), ending
    assert holds_for_slurm(run(DrainAsked("admin"), state=held))  # a drain alone still leaves Slurm to end it


def test_reports_and_heartbeats_end_with_the_coordinator_or_the_job() -> None:
    assert reports(AgentState()) and heartbeats(AgentState())
    lost = run(CoordinatorGone("its lease ran out"))
    assert not reports(lost) and not heartbeats(lost)
    stopped = run(StopReceived(False))
    assert reports(stopped) and not heartbeats(stopped)
    draining = run(Signalled("SIGTERM"))
    assert reports(draining) and heartbeats(draining) and drain_clock_runs(draining)


def test_failures_after_the_end_are_all_named() -> None:
    state = run(StopReceived(False), WorkerFailed("n1:0:0", 2), WorkerFailed("n1:1:0", 9))
    assert state.failed_after_end == ("n1:0:0 exited with 2", "n1:1:0 exited with 9")


def test_an_unknown_event_is_refused() -> None:
    with pytest.raises(TypeError, match="not an agent event"):
        step(AgentState(), "Stop")  # type: ignore[arg-type]


# --- the same verdicts as the flags it replaced ------------------------------------------------------------


@dataclass
class Flags:
    """The agent's state before this reducer, updated as its methods did (slurm_elastic/agent.py, 542bd6b)."""

    draining: bool = False
    signalled: bool = False
    stop: bool | None = None  # None: no Stop; else whether it carried an error (sticky, see the docstring)
    lost: bool = False
    failed_after_end: list[str] = field(default_factory=list)
    hold_s: float | None = None
    failure: str | None = None
    drains_reported: int = 0

    def see(self, event: AgentEvent) -> None:
        match event:
            case Signalled() | DrainAsked():
                self.signalled |= isinstance(event, Signalled)
                if not self.draining:
                    self.draining = True
                    self.drains_reported += 1
            case StopReceived(error=error):
                self.stop = error or bool(self.stop)
            case HoldAsked(hold_s=hold_s):
                self.hold_s = hold_s
            case ConnectionClosed():
                if self.stop is None:
                    self.lost = True
            case CoordinatorGone():
                self.lost = True
            case WorkerFailed(worker=worker, returncode=code):
                if self.stop is False:
                    self.failed_after_end.append(f"{worker} exited with {code}")
            case ControlLoopDied(reason=reason):
                self.failure = self.failure or reason

    def exit_code(self) -> int:
        if self.failure is not None or self.lost or self.stop or self.failed_after_end:
            return EXIT_FAILED
        return EXIT_DRAINED_BY_SIGNAL if self.signalled and self.stop is None else EXIT_OK

    def stopping(self) -> bool:
        return self.draining or self.stop is not None or self.lost or self.failure is not None

    def ends_now(self) -> bool:
        return self.lost or self.failure is not None or bool(self.stop)

    def requeues(self) -> bool:
        return self.failure is None and self.lost

    def holds(self) -> bool:
        ended = self.lost or self.stop is not None or self.signalled or self.failure is not None
        return self.hold_s is not None and not ended


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(EVENTS), max_size=12))
def test_any_sequence_of_events_gives_the_verdicts_of_the_old_flags(events: list[AgentEvent]) -> None:
    flags, state, drains_reported = Flags(), AgentState(), 0
    for event in events:
        flags.see(event)
        transition = step(state, event)
        state, drains_reported = transition.state, drains_reported + transition.report_drain
        assert exit_code(state) == flags.exit_code()
        assert stopping(state) == flags.stopping()
        assert ends_now(state) == flags.ends_now()
        assert requeues_job(state, True) == flags.requeues()
        assert holds_for_slurm(state) == flags.holds()
        assert drain_clock_runs(state) == flags.draining
        assert drains_reported == flags.drains_reported
    if state.phase == AgentPhase.FINISHED_BADLY:
        assert list(state.failed_after_end) == flags.failed_after_end


def test_an_agent_requeues_only_once_slurm_finds_the_batch_host_gone_too() -> None:
    verdict = functools.partial(requeue_verdict, job_running=True)
    assert verdict(coordinator_answers=False, batch_host_down=True) == RequeueVerdict(
        True, "Slurm finds the batch host unresponsive too"
    )
    # Slurm still reaches the batch host (or cannot say yet): only this node lost it; ask again later.
    assert verdict(coordinator_answers=False, batch_host_down=False) is None
    assert verdict(coordinator_answers=False, batch_host_down=None) is None
    for down in (True, False, None):  # the coordinator answers: this node alone was cut off
        answered = verdict(coordinator_answers=True, batch_host_down=down)
        assert answered is not None and not answered.requeue and "cut off" in answered.why
        ending = requeue_verdict(coordinator_answers=False, job_running=False, batch_host_down=down)
        assert ending is not None and not ending.requeue  # Slurm is ending or requeueing it already
