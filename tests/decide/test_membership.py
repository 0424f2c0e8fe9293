"""The membership reducer: every event in every phase, by hand-written scenarios."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_elastic.decide import membership as m

TIMEOUT = 30.0


def policy(expected: int = 3, min_workers: int = 1, recovery: m.Recovery = "in_process") -> m.Policy:
    return m.Policy(expected, min_workers, TIMEOUT, recovery)


def worker(i: int, node: int | None = None, local_rank: int = 0) -> m.Worker:
    return m.Worker(f"w{i}", f"n{i if node is None else node}", local_rank)


def feed(state: m.State, pol: m.Policy, *events: m.Event, now: float = 0.0) -> m.Outcome:
    """Feed events in order; returns the last outcome."""
    assert events
    out = m.Outcome(state, (), "")
    for event in events:
        out = m.decide(out.state, event, now, pol)
    return out


def running(n: int = 3, pol: m.Policy | None = None) -> m.State:
    """Generation 1 with members w1..wn, one per node n1..nn."""
    pol = pol or policy(n)
    out = feed(m.State(), pol, *(m.Joined(worker(i)) for i in range(1, n + 1)))
    assert out.state.phase == "running" and out.state.members == tuple(f"w{i}" for i in range(1, n + 1))
    return out.state


def only(actions: tuple[m.Action, ...], kind: type) -> object:
    assert len(actions) == 1 and isinstance(actions[0], kind), actions
    return actions[0]


def announce(out: m.Outcome) -> m.Announce:
    a = only(out.actions, m.Announce)
    assert isinstance(a, m.Announce)
    assert out.state.generation == a.generation
    return a


# --- rendezvous -------------------------------------------------------------------------------------


def test_rendezvous_completes_on_the_expected_count() -> None:
    pol = policy(3)
    out = feed(m.State(), pol, m.Joined(worker(1)), m.Joined(worker(2)))
    assert out.state.phase == "rendezvous" and out.actions == () and "2 of 3" in out.reason
    assert out.state.generation is None
    out = m.decide(out.state, m.Joined(worker(3)), 1.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(1, ("w1", "w2", "w3"), None, "start")
    assert a.joined == ("w1", "w2", "w3") and a.left == () and a.leaving == ()
    assert out.state.phase == "running" and not out.state.change_requested


def test_first_ranks_follow_nodes_in_natural_order_then_local_rank() -> None:
    pol = policy(5)
    joins = [
        m.Worker("c", "node10", 0),
        m.Worker("a", "node2", 1),
        m.Worker("b", "node2", 0),
        m.Worker("e", "node1", 0),
        m.Worker("d", "node9", 0),
    ]
    out = feed(m.State(), pol, *(m.Joined(w) for w in joins))
    assert announce(out).generation.ranks == ("e", "b", "a", "d", "c")


def test_order_ranks_keeps_survivors_and_sorts_newcomers() -> None:
    newcomers = [m.Worker("x", "n3", 1), m.Worker("y", "n3", 0), m.Worker("z", "n1", 0)]
    assert m.order_ranks(("s3", "s1", "s2"), newcomers) == ("s3", "s1", "s2", "z", "y", "x")


def test_rendezvous_times_out_from_the_first_registration() -> None:
    pol = policy(4, min_workers=2)
    state = m.decide(m.State(), m.Joined(worker(1)), 100.0, pol).state
    state = m.decide(state, m.Joined(worker(2)), 110.0, pol).state
    early = m.decide(state, m.Tick(), 100.0 + TIMEOUT - 0.001, pol)
    assert early.state == state and early.actions == ()
    out = m.decide(state, m.Tick(), 100.0 + TIMEOUT, pol)
    a = announce(out)
    assert a.generation.ranks == ("w1", "w2") and a.generation.cause == "start"
    assert "2 of 4" in out.reason and out.state.phase == "running"


def test_rendezvous_timeout_below_min_fails() -> None:
    pol = policy(4, min_workers=3)
    state = feed(m.State(), pol, m.Joined(worker(1)), m.Joined(worker(2)))
    out = m.decide(state.state, m.Tick(), TIMEOUT + 1, pol)
    fail = only(out.actions, m.Fail)
    assert out.state.phase == "failed" and isinstance(fail, m.Fail)
    assert "2 of 4" in fail.reason and "at least 3" in fail.reason and out.state.reason == fail.reason


def test_tick_without_workers_or_while_running_is_a_no_op() -> None:
    pol = policy(2)
    empty = m.decide(m.State(), m.Tick(), 1e9, pol)
    assert empty.state == m.State() and empty.actions == ()
    state = running(2)
    out = m.decide(state, m.Tick(), 1e9, pol)
    assert out.state == state and out.actions == ()


def test_rendezvous_clock_restarts_after_every_registrant_left() -> None:
    pol = policy(3, min_workers=1)
    state = m.decide(m.State(), m.Joined(worker(1)), 0.0, pol).state
    out = m.decide(state, m.Lost(("w1",), "crash"), 1.0, pol)
    assert out.actions == () and out.state.workers == {} and out.state.phase == "rendezvous"
    state = m.decide(out.state, m.Joined(worker(2)), 500.0, pol).state
    assert m.decide(state, m.Tick(), 500.0 + TIMEOUT - 1, pol).actions == ()
    assert announce(m.decide(state, m.Tick(), 500.0 + TIMEOUT, pol)).generation.ranks == ("w2",)


def test_events_before_the_first_generation() -> None:
    pol = policy(3)
    state = feed(m.State(), pol, m.Joined(worker(1)), m.Joined(worker(2))).state
    for event in (m.ReachedBoundary("w1", 1, 0), m.Faulted("w1", 1, "x"), m.Lost(("nobody",), "x")):
        out = m.decide(state, event, 0.0, pol)
        assert out.state == state and out.actions == ()
    out = m.decide(state, m.Drain(("n1",), "boundary", "reclaim"), 0.0, pol)
    assert out.actions == (m.Dismiss(("w1",), "reclaim"),) and set(out.state.workers) == {"w2"}
    out = m.decide(state, m.Done("w1", 1, 0), 0.0, pol)
    assert out.state == state and out.actions == () and "not current" in out.reason


# --- joins ------------------------------------------------------------------------------------------


def test_join_while_running_requests_one_boundary() -> None:
    pol = policy(3)
    state = running(3)
    out = m.decide(state, m.Joined(worker(4)), 0.0, pol)
    assert out.actions == (m.RequestBoundary(1),) and out.state.change_requested
    assert out.state.joiners == ("w4",) and out.state.members == state.members
    again = m.decide(out.state, m.Joined(worker(5)), 0.0, pol)
    assert again.actions == () and again.state.joiners == ("w4", "w5")


def test_boundary_appends_joiners_after_survivors() -> None:
    pol = policy(4)
    state = running(4)
    state = m.decide(state, m.Lost(("w2",), "crash"), 0.0, pol).state  # ranks w1 w3 w4, gen 2
    state = feed(state, pol, m.Joined(m.Worker("late", "n9", 1)), m.Joined(m.Worker("early", "n0", 0))).state
    out = m.decide(state, m.ReachedBoundary("w3", 2, 17), 0.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(3, ("w1", "w3", "w4", "early", "late"), 17, "join")
    assert sorted(a.joined) == ["early", "late"] and a.left == () and a.leaving == ()
    assert not out.state.change_requested and out.state.joiners == ()


def test_reports_of_the_same_boundary_from_other_members_are_stale() -> None:
    pol = policy(2)
    state = m.decide(running(2), m.Joined(worker(3)), 0.0, pol).state
    state = m.decide(state, m.ReachedBoundary("w1", 1, 5), 0.0, pol).state
    for event in (m.ReachedBoundary("w2", 1, 5), m.Faulted("w2", 1, "late")):
        out = m.decide(state, event, 0.0, pol)
        assert out.state == state and out.actions == () and "stale" in out.reason


def test_boundary_without_pending_change_keeps_the_ranks() -> None:
    out = m.decide(running(2), m.ReachedBoundary("w1", 1, 3), 0.0, policy(2))
    assert announce(out).generation == m.Generation(2, ("w1", "w2"), 3, "boundary")


# --- losses -----------------------------------------------------------------------------------------


def test_loss_of_a_member_forms_an_abrupt_generation() -> None:
    pol = policy(4)
    out = m.decide(running(4), m.Lost(("w2",), "node failure"), 0.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(2, ("w1", "w3", "w4"), None, "node failure")
    assert a.left == ("w2",) and a.leaving == () and a.joined == ()
    assert "w2" not in out.state.workers and out.state.phase == "running"


def test_loss_folds_pending_joiners_in() -> None:
    pol = policy(3)
    state = feed(running(3), pol, m.Joined(worker(5)), m.Joined(worker(4))).state
    out = m.decide(state, m.Lost(("w1", "w3"), "crash"), 0.0, pol)
    a = announce(out)
    assert a.generation.ranks == ("w2", "w4", "w5") and sorted(a.joined) == ["w4", "w5"] and a.left == ("w1", "w3")
    assert not out.state.change_requested and out.state.joiners == ()


def test_loss_of_every_member_fails() -> None:
    pol = policy(2)
    state = m.decide(running(2), m.Joined(worker(3)), 0.0, pol).state
    out = m.decide(state, m.Lost(("w1", "w2"), "power"), 0.0, pol)
    fail = only(out.actions, m.Fail)
    assert isinstance(fail, m.Fail) and "all members lost" in fail.reason and "power" in fail.reason
    assert out.state.phase == "failed"


def test_loss_of_a_non_member_forgets_it() -> None:
    pol = policy(2)
    state = m.decide(running(2), m.Joined(worker(3)), 0.0, pol).state
    out = m.decide(state, m.Lost(("w3",), "crash"), 0.0, pol)
    assert out.actions == () and out.state.joiners == () and out.state.generation == state.generation
    unknown = m.decide(state, m.Lost(("ghost",), "crash"), 0.0, pol)
    assert unknown.state == state and unknown.actions == ()


def test_a_member_whose_loop_ended_is_still_a_member() -> None:
    pol = policy(3)
    state = feed(running(3), pol, m.Done("w1", 1, 7)).state
    assert state.phase == "running" and dict(state.ended) == {"w1": m.LoopEnd(7)}
    # lost before the job completed: a member lost like any other; the loop ends are asked again
    out = m.decide(state, m.Lost(("w1",), "exited with 0"), 0.0, pol)
    assert announce(out).generation.ranks == ("w2", "w3") and out.state.ended == {}
    # a peer lost: the ended member heals the others in the next generation, and reports again there
    out = m.decide(state, m.Lost(("w2",), "crash"), 0.0, pol)
    assert announce(out).generation.ranks == ("w1", "w3") and out.state.ended == {}
    again = feed(out.state, pol, m.Done("w1", 1, 7))
    assert again.state.ended == {} and "not current" in again.reason  # a report of the old generation
    done = feed(out.state, pol, m.Done("w1", 2, 7), m.Done("w3", 2, 7))
    assert isinstance(only(done.actions, m.Complete), m.Complete) and done.state.phase == "finished"


def test_no_one_joins_a_generation_whose_loop_is_ending() -> None:
    """A joiner healed at the step where the others' loops ended would run on past it (WentOn): it waits
    until the job completes, and is then told the job is over."""
    pol = policy(3)
    state = feed(running(3), pol, m.Joined(worker(4)), m.Done("w1", 1, 7)).state
    out = m.decide(state, m.Lost(("w2",), "crash"), 0.0, pol)
    assert announce(out).generation.ranks == ("w1", "w3") and "w4" in out.state.joiners
    done = feed(out.state, pol, m.Done("w1", 2, 7), m.Done("w3", 2, 7))
    assert done.state.phase == "finished"


def test_losing_the_only_member_not_yet_ended_completes() -> None:
    pol = policy(3)
    state = feed(running(3), pol, m.Done("w1", 1, 5), m.Done("w3", 1, 5)).state
    assert state.phase == "running"
    out = m.decide(state, m.Lost(("w2",), "crash"), 0.0, pol)
    complete = only(out.actions, m.Complete)
    assert isinstance(complete, m.Complete) and out.state.phase == "finished" and "crash" in complete.reason


def test_every_member_done_at_one_step_completes() -> None:
    pol = policy(2)
    state = m.decide(running(2), m.Done("w1", 1, 9, "reached 9 steps"), 0.0, pol)
    assert state.actions == () and state.state.phase == "running"
    stranger = m.decide(state.state, m.Done("w9", 1, 9), 0.0, pol)
    assert stranger.state == state.state and stranger.actions == ()
    out = m.decide(state.state, m.Done("w2", 1, 9), 0.0, pol)
    complete = only(out.actions, m.Complete)
    assert isinstance(complete, m.Complete) and out.state.phase == "finished" and "step 9" in complete.reason


def test_loops_that_end_at_different_steps_fail_the_job_naming_both() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Done("w1", 1, 100, "job.steps(100) ran to its end"), 0.0, pol).state
    out = m.decide(state, m.Done("w2", 1, 120, "job.steps(120) ran to its end"), 0.0, pol)
    fail = only(out.actions, m.Fail)
    assert isinstance(fail, m.Fail) and out.state.phase == "failed"
    for part in ("w1 at step 100", "job.steps(100)", "w2 at step 120", "job.stop()"):
        assert part in fail.reason


def test_a_member_that_goes_on_past_an_ended_loop_fails_the_job() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Done("w1", 1, 10, "job.steps() left at step 10"), 0.0, pol).state
    behind = m.decide(state, m.WentOn("w2", 1, 10), 0.0, pol)  # still in step 10: it may end there too
    assert behind.state == state and behind.actions == ()
    stale = m.decide(state, m.WentOn("w2", 0, 11), 0.0, pol)
    assert stale.state == state and stale.actions == ()
    out = m.decide(state, m.WentOn("w2", 1, 11), 0.0, pol)
    fail = only(out.actions, m.Fail)
    assert isinstance(fail, m.Fail) and "w1 at step 10" in fail.reason and "w2 went on to step 11" in fail.reason
    assert m.decide(running(3), m.WentOn("w2", 1, 11), 0.0, pol).actions == ()  # no loop ended: nothing to say


def test_stop_asked_ends_the_job_at_the_next_boundary_once_every_member_reached_it() -> None:
    pol = policy(3)
    out = m.decide(running(3), m.StopAsked("w2", "time budget"), 0.0, pol)
    assert out.actions == (m.RequestBoundary(1),) and out.state.stop_asked == "time budget (asked by w2)"
    again = m.decide(out.state, m.StopAsked("w3", "time budget"), 0.0, pol)
    assert again.state == out.state and again.actions == ()
    state = feed(out.state, pol, m.Joined(worker(4)), m.ReachedBoundary("w1", 1, 12), m.ReachedBoundary("w2", 1, 12))
    assert state.state.phase == "running" and "waiting for w3" in state.reason
    end = m.decide(state.state, m.ReachedBoundary("w3", 1, 12), 0.0, pol)
    complete = only(end.actions, m.Complete)
    assert isinstance(complete, m.Complete) and "after step 12: time budget" in complete.reason
    assert set(end.state.ended) == {"w1", "w2", "w3"}  # (their exits after training are judged as such)


def test_stop_asked_survives_an_abrupt_change() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.StopAsked("w2", "budget"), 0.0, pol).state
    out = m.decide(state, m.Lost(("w1",), "crash"), 0.0, pol)
    assert announce_and_boundary(out) == ("w2", "w3")
    stranger = m.decide(running(3), m.StopAsked("w9", "budget"), 0.0, pol)
    assert stranger.actions == () and stranger.state.stop_asked is None


def announce_and_boundary(out: m.Outcome) -> tuple[str, ...]:
    a, boundary = out.actions
    assert isinstance(a, m.Announce) and boundary == m.RequestBoundary(a.generation.number)
    return a.generation.ranks


# --- drains -----------------------------------------------------------------------------------------


def test_drain_at_boundary() -> None:
    pol = policy(4)
    state = m.State()
    for w in (m.Worker("a", "n1", 0), m.Worker("b", "n1", 1), m.Worker("c", "n2", 0), m.Worker("d", "n3", 0)):
        state = m.decide(state, m.Joined(w), 0.0, pol).state
    out = m.decide(state, m.Drain(("n1",), "boundary", "reclaim"), 0.0, pol)
    assert out.actions == (m.RequestBoundary(1),) and out.state.draining == {"n1"}
    assert out.state.members == ("a", "b", "c", "d")
    out = m.decide(out.state, m.ReachedBoundary("c", 1, 12), 0.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(2, ("c", "d"), 12, "drain")
    assert a.leaving == ("a", "b") and a.left == ("a", "b") and a.joined == ()
    assert out.state.draining == frozenset() and set(out.state.workers) == {"c", "d"}
    # the node is free again: a later worker there joins normally
    again = m.decide(out.state, m.Joined(m.Worker("e", "n1", 0)), 0.0, pol)
    assert again.actions == (m.RequestBoundary(2),)


def test_drain_and_join_share_one_boundary() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Joined(worker(4)), 0.0, pol).state
    out = m.decide(state, m.Drain(("n2",), "boundary", "reclaim"), 0.0, pol)
    assert out.actions == () and out.state.draining == {"n2"}
    a = announce(m.decide(out.state, m.ReachedBoundary("w1", 1, 4), 0.0, pol))
    assert a.generation == m.Generation(2, ("w1", "w3", "w4"), 4, "join+drain")
    assert a.joined == ("w4",) and a.leaving == ("w2",)


def test_drain_now_is_abrupt() -> None:
    pol = policy(3)
    out = m.decide(running(3), m.Drain(("n2",), "now", "preempted"), 0.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(2, ("w1", "w3"), None, "drain-now: preempted")
    assert a.leaving == ("w2",) and a.left == ("w2",)
    assert "w2" not in out.state.workers


def test_drain_now_of_every_member_fails() -> None:
    pol = policy(2)
    state = feed(m.State(), pol, m.Joined(worker(1, 1)), m.Joined(worker(2, 1))).state
    out = m.decide(state, m.Drain(("n1",), "now", "gone"), 0.0, pol)
    assert isinstance(only(out.actions, m.Fail), m.Fail) and out.state.phase == "failed"


def test_drain_of_joiners_dismisses_them() -> None:
    pol = policy(2)
    state = feed(running(2), pol, m.Joined(worker(3, 7)), m.Joined(worker(4, 7))).state
    out = m.decide(state, m.Drain(("n7",), "boundary", "reclaim"), 0.0, pol)
    assert out.actions == (m.Dismiss(("w3", "w4"), "reclaim"),)
    assert out.state.joiners == () and out.state.generation == state.generation
    assert out.state.draining == frozenset()


def test_drain_of_a_node_with_members_and_joiners() -> None:
    pol = policy(2)
    state = feed(m.State(), pol, m.Joined(worker(1, 1)), m.Joined(worker(2, 2))).state
    out = m.decide(state, m.Drain(("n2",), "boundary", "shrink"), 0.0, pol)
    state = m.decide(out.state, m.Joined(worker(3, 1)), 0.0, pol).state  # boundary already pending
    out = m.decide(state, m.Drain(("n1",), "boundary", "shrink"), 0.0, pol)
    assert out.actions == (m.Dismiss(("w3",), "shrink"),) and out.state.draining == {"n1", "n2"}


def test_drain_of_an_empty_node_is_a_no_op() -> None:
    state = running(2)
    out = m.decide(state, m.Drain(("n9",), "now", "x"), 0.0, policy(2))
    assert out.state == state and out.actions == ()


def test_drain_of_every_member_suspends_at_the_boundary() -> None:
    pol = policy(2)
    out = m.decide(running(2), m.Drain(("n1", "n2"), "boundary", "maintenance"), 0.0, pol)
    assert out.actions == (m.RequestBoundary(1),)
    out = m.decide(out.state, m.ReachedBoundary("w2", 1, 30), 0.0, pol)
    # w1 may still be reducing step 30: a Stop now would interrupt it before it commits the step
    assert out.actions == () and out.state.phase == "running" and "waiting for w1" in out.reason
    out = m.decide(out.state, m.ReachedBoundary("w2", 1, 30), 0.0, pol)
    assert out.actions == (), "a repeated report is not a second member"
    out = m.decide(out.state, m.ReachedBoundary("w1", 1, 30), 0.0, pol)
    suspend = only(out.actions, m.Suspend)
    assert isinstance(suspend, m.Suspend) and suspend.step == 30 and "every member is leaving" in suspend.reason
    assert out.state.phase == "suspended"


def test_a_member_lost_while_a_suspension_waits_forms_a_generation_that_must_reach_its_own_boundary() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Drain(("n1", "n2", "n3"), "boundary", "preempted"), 0.0, pol).state
    state = m.decide(state, m.ReachedBoundary("w1", 1, 9), 0.0, pol).state
    out = m.decide(state, m.Lost(("w3",), "crash"), 0.0, pol)
    assert out.actions[1:] == (m.RequestBoundary(2),) and out.state.at_boundary == frozenset()
    out = m.decide(out.state, m.ReachedBoundary("w1", 2, 10), 0.0, pol)
    assert out.actions == (), "w1's report of generation 1 does not count for generation 2"
    out = m.decide(out.state, m.ReachedBoundary("w2", 2, 10), 0.0, pol)
    assert isinstance(only(out.actions, m.Suspend), m.Suspend)


def test_joiners_on_a_draining_node_are_dismissed() -> None:
    pol = policy(2)
    state = m.decide(running(2), m.Drain(("n2",), "boundary", "reclaim"), 0.0, pol).state
    out = m.decide(state, m.Joined(m.Worker("w2b", "n2", 1)), 0.0, pol)
    assert out.actions == (m.Dismiss(("w2b",), "node n2 is draining"),)
    assert out.state == state


def test_loss_while_a_drain_is_pending_drops_the_draining_members_at_once() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Drain(("n1",), "boundary", "reclaim"), 0.0, pol).state
    out = m.decide(state, m.Lost(("w3",), "crash"), 0.0, pol)
    a = announce(out)
    assert a.generation.ranks == ("w2",) and a.leaving == ("w1",) and a.left == ("w1", "w3")
    assert out.state.draining == frozenset()


def test_drain_survives_an_abrupt_change_that_leaves_only_draining_members() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Drain(("n1", "n2"), "boundary", "maintenance"), 0.0, pol).state
    out = m.decide(state, m.Lost(("w3",), "crash"), 0.0, pol)
    assert out.actions[0] == m.Announce(m.Generation(2, ("w1", "w2"), None, "crash"), (), (), ("w3",))
    # the drain is still pending, so generation 2 must be asked for a boundary again
    assert out.actions[1:] == (m.RequestBoundary(2),) and out.state.change_requested
    out = feed(out.state, pol, m.ReachedBoundary("w1", 2, 8), m.ReachedBoundary("w2", 2, 8))
    assert isinstance(only(out.actions, m.Suspend), m.Suspend)


# --- faults, restart mode, abort, terminal phases ---------------------------------------------------


def test_fault_re_forms_the_same_members() -> None:
    pol = policy(3)
    out = m.decide(running(3), m.Faulted("w2", 1, "gloo timeout"), 0.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(2, ("w1", "w2", "w3"), None, "collective failure: gloo timeout")
    assert a.left == () and a.leaving == () and a.joined == ()
    stale = m.decide(out.state, m.Faulted("w2", 1, "gloo timeout"), 0.0, pol)
    assert stale.state == out.state and stale.actions == ()


def test_restart_mode_restarts_everyone_and_waits_for_the_survivors() -> None:
    pol = policy(3, recovery="restart")
    out = m.decide(running(3, pol), m.Lost(("w2",), "node failure"), 50.0, pol)
    restart = only(out.actions, m.RestartAll)
    assert isinstance(restart, m.RestartAll) and "node failure" in restart.reason
    state = out.state
    assert state.phase == "rendezvous" and state.workers == {} and state.expected_override == 2
    assert state.rendezvous_since == 50.0
    state = m.decide(state, m.Joined(worker(11)), 51.0, pol).state
    assert state.phase == "rendezvous"
    out = m.decide(state, m.Joined(worker(12)), 52.0, pol)
    a = announce(out)
    assert a.generation == m.Generation(2, ("w11", "w12"), None, "restart")
    assert out.state.expected_override is None


def test_restart_mode_rendezvous_times_out_from_the_restart() -> None:
    pol = policy(3, min_workers=1, recovery="restart")
    state = m.decide(running(3, pol), m.Lost(("w2",), "crash"), 50.0, pol).state
    state = m.decide(state, m.Joined(worker(11)), 51.0, pol).state
    assert m.decide(state, m.Tick(), 50.0 + TIMEOUT - 1, pol).actions == ()
    a = announce(m.decide(state, m.Tick(), 50.0 + TIMEOUT, pol))
    assert a.generation.ranks == ("w11",) and a.generation.number == 2


def test_restart_mode_loss_of_everyone_fails() -> None:
    pol = policy(2, recovery="restart")
    out = m.decide(running(2, pol), m.Lost(("w1", "w2"), "power"), 0.0, pol)
    assert isinstance(only(out.actions, m.Fail), m.Fail)


@pytest.mark.parametrize("phase", ["rendezvous", "running"])
def test_abort_fails(phase: str) -> None:
    pol = policy(2)
    state = running(2) if phase == "running" else m.decide(m.State(), m.Joined(worker(1)), 0.0, pol).state
    out = m.decide(state, m.Abort("same failure 3 times"), 0.0, pol)
    assert out.actions == (m.Fail("same failure 3 times"),) and out.state.phase == "failed"
    assert out.state.reason == "same failure 3 times"


ALL_EVENTS: list[m.Event] = [
    m.Joined(worker(9)),
    m.Lost(("w1",), "x"),
    m.Drain(("n1",), "now", "x"),
    m.Drain(("n1",), "boundary", "x"),
    m.ReachedBoundary("w1", 1, 3),
    m.Faulted("w1", 1, "x"),
    m.Done("w1", 1, 3),
    m.WentOn("w1", 1, 4),
    m.StopAsked("w1", "x"),
    m.Tick(),
    m.Abort("x"),
]


@pytest.mark.parametrize("phase", ["finished", "failed", "suspended"])
@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_terminal_phases_ignore_everything(phase: m.Phase, event: m.Event) -> None:
    state = replace(running(2), phase=phase)
    out = m.decide(state, event, 1e9, policy(2))
    assert out.state is state and out.actions == () and phase in out.reason


def test_a_drained_node_whose_workers_were_all_lost_can_host_workers_again() -> None:
    pol = policy(3)
    state = m.decide(running(3), m.Drain(("n1",), "boundary", "shrink"), 0.0, pol).state
    out = m.decide(state, m.Lost(("w1",), "killed by the shrink"), 0.0, pol)
    assert announce(out).generation.ranks == ("w2", "w3") and out.state.draining == frozenset()
    back = m.decide(out.state, m.Joined(m.Worker("w1b", "n1", 0)), 0.0, pol)
    assert back.actions == (m.RequestBoundary(2),)


def test_a_drain_whose_member_ended_its_loop_and_exited_is_cleared() -> None:
    pol = policy(3)
    state = feed(running(3), pol, m.Drain(("n1",), "boundary", "shrink"), m.Done("w1", 1, 6)).state
    out = m.decide(state, m.Lost(("w1",), "exit 0"), 0.0, pol)
    assert announce(out).generation.ranks == ("w2", "w3") and out.state.draining == frozenset()


# --- when every holder of the state is lost ----------------------------------------------------------


def test_losing_every_member_with_checkpoints_restarts_the_rest_from_the_latest_one() -> None:
    pol = replace(policy(3), checkpoint_fallback=True)
    state = m.decide(running(3), m.Joined(m.Worker("w1b", "n1", 0)), 0.0, pol).state  # a restarted worker waits
    out = m.decide(state, m.Lost(("w1", "w2", "w3"), "connection closed"), 5.0, pol)
    restart = only(out.actions, m.RestartAll)
    assert isinstance(restart, m.RestartAll) and restart.fallback and "latest checkpoint" in restart.reason
    assert out.state.phase == "rendezvous" and out.state.workers == {} and out.state.expected_override == 1
    assert out.state.rendezvous_since == 5.0


def test_losing_every_member_without_checkpoints_fails_and_says_what_would_have_saved_the_run() -> None:
    out = m.decide(running(2), m.Lost(("w1", "w2"), "connection closed"), 0.0, policy(2))
    fail = only(out.actions, m.Fail)
    assert isinstance(fail, m.Fail) and "--checkpoint-dir" in fail.reason and out.state.phase == "failed"


def test_state_lost_restarts_everyone_from_the_checkpoint_when_the_job_writes_them() -> None:
    pol = m.Policy(expected_workers=3, checkpoint_fallback=True)
    out = m.decide(running(3), m.StateLost("w2", 1, "shard 1/3 has no live holder"), 0.0, pol)
    assert out.state.phase == "rendezvous"
    assert any(isinstance(a, m.RestartAll) and a.fallback for a in out.actions)
    assert "shard 1/3" in out.reason


def test_state_lost_fails_the_job_naming_the_checkpoint_setting_without_checkpoints() -> None:
    out = m.decide(running(3), m.StateLost("w2", 1, "shard 1/3 has no live holder"), 0.0, m.Policy(expected_workers=3))
    assert out.state.phase == "failed" and "--checkpoint-dir" in out.reason
    assert any(isinstance(a, m.Fail) for a in out.actions)


def test_a_stale_state_lost_report_is_ignored() -> None:
    pol = m.Policy(expected_workers=3, checkpoint_fallback=True)
    out = m.decide(running(3), m.StateLost("w2", 7, "old"), 0.0, pol)
    assert out.actions == () and "stale" in out.reason
