"""Recovery plans: who is a source, who receives, and how the chunks are spread over the sources."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.transfer import PeerState, RecoveryPlan, Send, chunk_bounds, plan_recovery

GOOD = (10.0, 20.0)
OTHER = (11.0, 21.0)
NAN = (math.nan, math.nan)


def peers(*specs: tuple[int, tuple[float, ...]]) -> list[PeerState]:
    return [PeerState(rank, step, fp) for rank, (step, fp) in enumerate(specs)]


def test_fresh_start_rank_zero_sends_to_everyone() -> None:
    plan = plan_recovery(peers((-1, (0.0, 0.0)), (-1, (1.0, 1.0)), (-1, (2.0, 2.0))))
    assert plan.target_step >= 0 and plan.sources == (0,) and plan.receivers == (1, 2)
    assert plan.n_chunks == 1 and plan.sends == (Send(0, 0, 1), Send(0, 0, 2))
    assert "fresh start" in plan.reason


def test_fresh_start_picks_the_lowest_rank_whatever_the_order() -> None:
    plan = plan_recovery([PeerState(4, -1, GOOD), PeerState(2, -1, GOOD), PeerState(7, -1, GOOD)])
    assert plan.sources == (2,) and plan.receivers == (4, 7)


def test_single_fresh_peer_needs_no_transfer() -> None:
    plan = plan_recovery([PeerState(0, -1, GOOD)])
    assert plan.receivers == () and plan.sends == () and plan.target_step >= 0


def test_target_is_the_newest_committed_step_among_healthy_peers() -> None:
    # rank 3 is ahead but corrupt: it must not set the target
    plan = plan_recovery(peers((5, GOOD), (6, GOOD), (-1, GOOD), (7, NAN), (6, GOOD)))
    assert plan.target_step == 6 and plan.sources == (1, 4) and plan.receivers == (0, 2, 3)


def test_everyone_in_agreement_needs_no_transfer() -> None:
    plan = plan_recovery(peers((3, GOOD), (3, GOOD)))
    assert plan == RecoveryPlan(3, (0, 1), (), 0, (), plan.reason)
    assert "already everywhere" in plan.reason


def test_minority_fingerprint_receives() -> None:
    plan = plan_recovery(peers((4, OTHER), (4, GOOD), (4, GOOD), (2, GOOD)))
    assert plan.target_step == 4 and plan.sources == (1, 2) and plan.receivers == (0, 3)
    assert "1 replicas at step 4 disagree" in plan.reason


def test_infinite_fingerprint_is_unhealthy() -> None:
    plan = plan_recovery(peers((4, (math.inf, 1.0)), (4, GOOD)))
    assert plan.sources == (1,) and plan.receivers == (0,)


def test_tie_between_fingerprint_groups_goes_to_the_lowest_rank() -> None:
    plan = plan_recovery(peers((4, OTHER), (4, GOOD), (4, GOOD), (4, OTHER)))
    assert plan.sources == (0, 3) and plan.receivers == (1, 2)
    plan = plan_recovery([PeerState(5, 4, OTHER), PeerState(1, 4, GOOD), PeerState(9, 4, OTHER), PeerState(2, 4, GOOD)])
    assert plan.sources == (1, 2) and plan.receivers == (5, 9)


def test_no_healthy_replica_gives_no_target() -> None:
    plan = plan_recovery(peers((3, NAN), (-1, GOOD), (5, NAN)))
    assert plan.target_step == -1 and plan.sources == () and plan.receivers == (0, 1, 2) and plan.sends == ()
    assert "no healthy replica" in plan.reason


def test_empty_peer_list_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one peer"):
        plan_recovery([])


def test_sends_from_and_to() -> None:
    plan = plan_recovery(peers((2, GOOD), (2, GOOD), (-1, GOOD), (-1, GOOD)))
    assert plan.n_chunks == 2
    for dst in (2, 3):
        assert sorted(s.chunk for s in plan.sends_to(dst)) == [0, 1]
        assert {s.src for s in plan.sends_to(dst)} == {0, 1}
    assert len(plan.sends_from(0)) == len(plan.sends_from(1)) == 2


# --- properties -------------------------------------------------------------------------------------

# Mostly agreeing replicas at one step, so that large source sets (more sources than chunks) are common.
fingerprints = st.sampled_from([GOOD, GOOD, GOOD, GOOD, OTHER, NAN])
steps = st.sampled_from([3, 3, 3, 3, -1, -1, 2, 4])


@st.composite
def peer_lists(draw: st.DrawFn) -> list[PeerState]:
    n = draw(st.integers(1, 24))
    ranks = draw(st.permutations(range(n)))
    return [PeerState(r, draw(steps), draw(fingerprints)) for r in ranks]


@settings(deadline=None, max_examples=400)
@given(views=peer_lists(), max_chunks=st.integers(1, 10))
def test_recovery_plan_properties(views: list[PeerState], max_chunks: int) -> None:
    plan = plan_recovery(views, max_chunks)
    assert plan == plan_recovery(list(reversed(views)), max_chunks)  # the order of the views does not matter
    by_rank = {p.rank: p for p in views}
    assert sorted(plan.sources + plan.receivers) == sorted(by_rank)
    assert not set(plan.sources) & set(plan.receivers)
    healthy = [p for p in views if p.committed_step >= 0 and all(math.isfinite(x) for x in p.fingerprint)]
    if healthy:
        assert plan.target_step == max(p.committed_step for p in healthy)
        for src in plan.sources:
            assert by_rank[src].committed_step == plan.target_step and by_rank[src] in healthy
        assert len({by_rank[s].fingerprint for s in plan.sources}) == 1
        # the sources are the largest group of agreeing replicas at the target
        at_target = Counter(p.fingerprint for p in healthy if p.committed_step == plan.target_step)
        assert len(plan.sources) == max(at_target.values())
    elif any(p.committed_step >= 0 for p in views):
        assert plan.target_step == -1 and plan.sources == () and plan.sends == ()
        return
    else:
        assert plan.sources == (min(by_rank),)
    if not plan.receivers:
        assert plan.sends == ()
        return
    assert plan.n_chunks == min(len(plan.sources), max_chunks)
    assert len(plan.sends) == len(set(plan.sends)) == plan.n_chunks * len(plan.receivers)
    for dst in plan.receivers:
        got = plan.sends_to(dst)
        assert sorted(s.chunk for s in got) == list(range(plan.n_chunks))  # every chunk exactly once
        assert len({s.src for s in got}) == len(got)  # from different sources
    assert all(s.src in plan.sources and s.dst in plan.receivers for s in plan.sends)
    load = Counter(s.src for s in plan.sends)
    if len(plan.sends) >= len(plan.sources):
        counts = [load.get(src, 0) for src in plan.sources]
        assert max(counts) - min(counts) <= 1, counts


def test_many_sources_few_receivers_spread_the_load() -> None:
    views = [PeerState(r, 3, GOOD) for r in range(10)] + [PeerState(10, -1, GOOD), PeerState(11, -1, GOOD)]
    plan = plan_recovery(views, max_chunks=8)
    assert plan.n_chunks == 8
    load = Counter(s.src for s in plan.sends)
    assert sorted(load[src] for src in plan.sources) == [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]


@settings(deadline=None, max_examples=300)
@given(total=st.integers(0, 10**9), n_chunks=st.integers(1, 64))
def test_chunk_bounds_partition_the_range(total: int, n_chunks: int) -> None:
    bounds = [chunk_bounds(total, n_chunks, c) for c in range(n_chunks)]
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end == start
    sizes = [end - start for start, end in bounds]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
