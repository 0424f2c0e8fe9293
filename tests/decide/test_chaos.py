"""The chaos planner: the same seed gives the same plan; every fault hits a node that is there; the job
always keeps a holder of its state and never falls below its minimum without a join first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.chaos import LOCAL_KINDS, ChaosFault, plan_chaos, steps_needed

REMOVES = {"worker_kill", "node_loss", "hang", "drain", "recovery_fault", "transfer_fault"}


def replay(plan: list[ChaosFault], nodes: int) -> list[int]:
    """Follow the plan's membership; return the number of nodes alive after each fault."""
    alive = {f"local{i}" for i in range(1, nodes + 1)}
    next_node, sizes = nodes + 1, []
    for fault in plan:
        if fault.kind == "join":
            alive.add(f"local{next_node}")
            next_node += 1
        else:
            assert fault.node in alive, f"{fault} hits a node that is not there"
            alive.remove(fault.node)
        sizes.append(len(alive))
    return sizes


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    assert plan_chaos(7, 20, nodes=4) == plan_chaos(7, 20, nodes=4)
    assert plan_chaos(7, 20, nodes=4) != plan_chaos(8, 20, nodes=4)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), faults=st.integers(0, 40), nodes=st.integers(3, 8))
def test_every_fault_hits_a_live_node_and_the_job_keeps_a_holder(seed: int, faults: int, nodes: int) -> None:
    plan = plan_chaos(seed, faults, nodes=nodes)
    assert len(plan) == faults
    sizes = replay(plan, nodes)
    assert all(n >= 2 for n in sizes), "a removal needs three alive: two stay, so a holder always survives"
    steps = [f.step for f in plan]
    assert steps == sorted(steps) and (not steps or steps[0] >= 5)
    assert steps_needed(plan) > max(steps, default=0)
    for i, fault in enumerate(plan):
        if fault.kind == "transfer_fault":
            assert plan[i - 1].kind == "join" and plan[i - 1].step == fault.step, "a joiner brings the transfer"
        if fault.kind in ("worker_kill", "hang"):
            assert fault.phase in ("forward", "backward", "bucket", "allreduce", "optimizer", "commit")


def test_twenty_faults_mix_every_local_kind() -> None:
    kinds = {f.kind for seed in range(5) for f in plan_chaos(seed, 20, nodes=4)}
    assert kinds == set(LOCAL_KINDS)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="min_nodes"):
        plan_chaos(0, 5, nodes=1)
