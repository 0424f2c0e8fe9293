"""`bench coordinator`'s simulated nodes against the real coordinator, at a size the suite can afford: every
kind of fault is injected, seen by the coordinator and attributed to the generation that answered it."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from slurm_elastic.showcase.bench.coordinator import Announced, CoordinatorPlan, announced_after, run


def _gen(number: int, first: float, left: Iterable[str] = (), joined: Iterable[str] = ()) -> Announced:
    return Announced(number, first, first + 0.01, 4, 4, set(left), set(joined))


def test_a_fault_is_answered_by_the_first_generation_that_took_all_of_its_workers_out() -> None:
    generations = {
        2: _gen(2, 1.0, left={"a-0"}),  # before the fault: not its answer
        3: _gen(3, 5.0, left={"b-0"}),
        4: _gen(4, 5.1, joined={"c-0"}),
        5: _gen(5, 5.2, left={"b-1"}),
    }
    assert announced_after(generations, {"b-0", "b-1"}, 4.0, "left") is generations[5]
    assert announced_after(generations, {"b-0"}, 4.0, "left") is generations[3]
    assert announced_after(generations, {"c-0"}, 4.0, "joined") is generations[4]
    assert announced_after(generations, {"a-0"}, 4.0, "left") is None
    assert announced_after(generations, {"d-0"}, 0.0, "joined") is None


@pytest.mark.timeout(240)
def test_simulated_nodes_against_the_real_coordinator() -> None:
    plan = CoordinatorPlan(
        agents=8, workers=2, processes=2, kills=2, silences=1, drains=1, joins=1, steady_s=2.0, lease_s=3.0
    )
    result = run(plan, lambda line: None)
    assert result["faults"] == {"closed": 2, "silent": 1, "drain": 1, "join": 1}
    assert result["agents"] == 8 and result["workers_per_agent"] == 2 and result["lease_s"] == 3.0
    # A closed connection is seen at once; a silent node only once its lease ran out, and within two.
    assert 0 < result["detect_closed_p99_s"] < result["detect_silent_p50_s"] <= 2 * plan.lease_s
    assert result["detect_silent_p50_s"] >= plan.lease_s - 2 * result["heartbeat_s"]
    assert result["join_p50_s"] > 0 and result["drain_p50_s"] > 0
    # Every fault made at least one generation, each delivered to all of its members.
    assert result["generations"] >= 1 + 2 + 1 + 1 + 1
    assert 0 <= result["form_p50_s"] <= result["form_p99_s"]
    # Steady state, per node and second: its agent's heartbeat and its relay's one frame of both workers'
    # heartbeats in (rank 0's commit besides), and one pulse out, to its agent: not a frame per worker.
    assert 16 * 0.5 < result["frames_in_per_s"] < 16 * 1.5 + 2
    assert 8 * 0.5 < result["frames_out_per_s"] < 8 * 1.5
    assert 0 < result["coordinator_cpu_fraction"] < 1
    assert result["coordinator_rss_mb"] > 0
