"""The chaos planner: the same seed gives the same plan; every fault hits a node that is there; the job
always keeps a holder of its state and never falls below its minimum without a join first."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.chaos import (
    ABRUPT,
    LOCAL_KINDS,
    SLURM_KINDS,
    ChaosFault,
    plan_chaos,
    plan_slurm_chaos,
    steps_needed,
)

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


NODES = ("n1", "n2", "n3", "n4")


def replay_slurm(plan: list[ChaosFault]) -> None:
    """Follow the core allocation and the satellites as Slurm and the refills would; fail on a fault that
    could not happen (a satellite that is not there, the batch host hit, a core too small to shrink)."""
    core, satellites = list(NODES), []
    for i, fault in enumerate(plan):
        if fault.kind == "shrink" or (fault.kind == "reclaim" and fault.node is not None):
            assert len(core) == len(NODES), f"{fault}: the core job is resized once (Slurm without accounting)"
        if fault.kind == "batch_host_cut":
            assert fault.node == "n1" and i + 1 == len(plan), f"{fault}: the batch host is cut last, if ever"
            continue
        assert fault.node != "n1", f"{fault}: the batch host is hit by its own cut only"
        if fault.kind == "shrink" or (fault.kind == "reclaim" and fault.node is not None):
            assert fault.node == core[-1] and len(core) >= 3, f"{fault}: Slurm gives back the core's last node"
            satellites.append(core.pop())
        elif fault.kind == "reclaim":
            assert satellites, f"{fault}: reclaim takes a satellite only when there is one"
        elif fault.kind in ("preempt_satellite", "drain"):
            assert fault.node in satellites, f"{fault}: hits a satellite"
        else:
            assert fault.node in core[1:], f"{fault}: faults in training processes hit core nodes"
        if fault.kind in ("recovery_fault", "transfer_fault"):
            assert i + 1 < len(plan), "a recovery or transfer fault needs a successor"
            successor = plan[i + 1]
            assert successor.node != fault.node and successor.kind not in ("recovery_fault", "transfer_fault")
            if fault.kind == "recovery_fault":
                assert successor.kind in ABRUPT, "a recovery fault strikes in the recovery its successor starts"


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10**6), faults=st.integers(0, 40))
def test_a_slurm_plan_only_has_faults_that_can_happen(seed: int, faults: int) -> None:
    plan = plan_slurm_chaos(seed, faults, nodes=NODES)
    assert len(plan) == faults
    replay_slurm(plan)
    steps = [f.step for f in plan]
    assert all(b - a >= 10 for a, b in itertools.pairwise(steps)), "room for each fault's refill"


def test_a_slurm_plan_is_fixed_by_its_seed_and_mixes_every_slurm_kind() -> None:
    assert plan_slurm_chaos(3, 20, nodes=NODES) == plan_slurm_chaos(3, 20, nodes=NODES)
    assert plan_slurm_chaos(3, 20, nodes=NODES) != plan_slurm_chaos(4, 20, nodes=NODES)
    kinds = {f.kind for seed in range(12) for f in plan_slurm_chaos(seed, 20, nodes=NODES)}
    assert kinds == set(SLURM_KINDS)
    with pytest.raises(ValueError, match="3 nodes"):
        plan_slurm_chaos(0, 5, nodes=("n1", "n2"))
