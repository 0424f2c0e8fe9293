"""Silent and hung members, judged from heartbeats and progress marks at an injected time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.health import Liveness, Verdict, find_unresponsive, stalled_for

LEASE = 10.0
HANG = 60.0


def judge(now: float, *members: Liveness) -> tuple[Verdict, ...]:
    return find_unresponsive(now, list(members), lease_timeout_s=LEASE, hang_timeout_s=HANG)


def live(wid: str, *, seen: float = 1000.0, step: int = 5, phase: str = "compute", since: float = 1000.0) -> Liveness:
    return Liveness(wid, seen, step, phase, since)


def test_everyone_fresh_gives_no_verdict() -> None:
    assert judge(1000.0, live("a"), live("b", phase="allreduce")) == ()
    assert judge(1000.0) == ()


def test_lease_expires_strictly_after_the_timeout() -> None:
    member = live("a", seen=990.0)
    assert judge(990.0 + LEASE, member) == ()
    (verdict,) = judge(990.0 + LEASE + 0.5, member)
    assert verdict.worker_id == "a" and verdict.cause == "lease" and "10.5 s" in verdict.reason


def test_hang_only_when_a_peer_waits_in_the_same_step() -> None:
    now = 900.0 + HANG + 1
    waiting_same = live("peer", seen=now, step=5, phase="allreduce", since=now - 1)
    waiting_other = live("peer", seen=now, step=4, phase="allreduce", since=now - 1)
    computing = live("peer", seen=now, step=5, phase="compute", since=now - 1)
    fresh_slow = live("slow", seen=now, step=5, phase="compute", since=900.0)
    (verdict,) = judge(now, fresh_slow, waiting_same)
    assert verdict == Verdict("slow", "hang", verdict.reason)
    assert "61.0 s" in verdict.reason and "step 6" in verdict.reason
    assert judge(now, fresh_slow, waiting_other) == ()
    assert judge(now, fresh_slow, computing) == ()
    assert judge(now, fresh_slow) == ()  # alone: nobody is blocked on it


def test_hang_needs_more_than_the_hang_timeout() -> None:
    now = 2000.0
    slow = live("slow", seen=now, phase="compute", since=now - HANG)
    peer = live("peer", seen=now, phase="allreduce", since=now)
    assert judge(now, slow, peer) == ()
    assert [v.worker_id for v in judge(now + 0.1, slow, peer)] == ["slow"]


def test_no_verdict_when_everyone_waits_in_the_collective() -> None:
    now = 5000.0
    members = [live(w, seen=now, phase="allreduce", since=now - 10 * HANG) for w in "abcd"]
    assert judge(now, *members) == ()


@pytest.mark.parametrize("phase", ["optimizer", "commit", "recovery", "boundary", "init"])
def test_only_computing_members_can_hang(phase: str) -> None:
    now = 5000.0
    stuck = live("a", seen=now, phase=phase, since=0.0)
    peer = live("b", seen=now, phase="allreduce", since=now)
    assert judge(now, stuck, peer) == ()


def test_a_silent_member_is_judged_by_its_lease_not_as_hung() -> None:
    now = 5000.0
    silent = live("a", seen=now - LEASE - 1, phase="compute", since=0.0)
    peer = live("b", seen=now, phase="allreduce", since=now)
    (verdict,) = judge(now, silent, peer)
    assert verdict.cause == "lease"


@settings(deadline=None, max_examples=200)
@given(
    members=st.lists(
        st.builds(
            Liveness,
            st.sampled_from("abcdefgh"),
            st.floats(0, 200),
            st.integers(0, 3),
            st.sampled_from(["compute", "allreduce", "optimizer"]),
            st.floats(0, 200),
        ),
        max_size=8,
        unique_by=lambda m: m.worker_id,
    ),
    now=st.floats(0, 300),
)
def test_verdicts_follow_the_rules(members: list[Liveness], now: float) -> None:
    verdicts = find_unresponsive(now, members, lease_timeout_s=LEASE, hang_timeout_s=HANG)
    by_id = {v.worker_id: v for v in verdicts}
    assert len(by_id) == len(verdicts)
    waiting = {m.step for m in members if m.phase == "allreduce"}
    for m in members:
        if now - m.last_seen > LEASE:
            assert by_id[m.worker_id].cause == "lease"
        elif m.phase == "compute" and now - m.phase_since > HANG and m.step in waiting:
            assert by_id[m.worker_id].cause == "hang"
        else:
            assert m.worker_id not in by_id
    if all(m.phase == "allreduce" for m in members):
        assert all(v.cause == "lease" for v in verdicts)


# --- a loop that was itself stopped ---------------------------------------------------------------------


def test_an_ordinary_delay_is_not_a_stall() -> None:
    assert stalled_for(100.0, 100.1, 0.1) == 0.0
    assert stalled_for(100.0, 100.45, 0.1) == 0.0, "under a second is scheduling noise"
    assert stalled_for(100.0, 104.0, 1.0) == 0.0, "within five intervals"


def test_a_stop_longer_than_five_intervals_and_a_second_is_a_stall_of_the_excess() -> None:
    assert stalled_for(100.0, 130.0, 0.1) == pytest.approx(29.9)
    assert stalled_for(100.0, 106.0, 1.0) == pytest.approx(5.0)


def test_a_loop_that_was_busy_for_its_gap_was_slow_not_stopped() -> None:
    """A coordinator working through a burst (thousands of peers' frames at once) keeps judging silence:
    were every slow turn a stop, a silent node's lease would be extended again and again."""
    assert stalled_for(100.0, 102.0, 0.1, busy_s=1.9) == 0.0
    assert stalled_for(100.0, 102.0, 0.1, busy_s=1.0) == 0.0, "half of the gap on the CPU: slow"
    assert stalled_for(100.0, 102.0, 0.1, busy_s=0.2) == pytest.approx(1.9), "barely ran: stopped"
    assert stalled_for(100.0, 130.0, 0.1, busy_s=0.0) == pytest.approx(29.9)
