"""The fault plan: who fires which fault, and the record that makes each fire once per job."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.faults import FaultPlan
from slurm_elastic.testing.injector import FaultInjector, InjectedFault


def plan(tmp_path: Path | None = None) -> FaultPlan:
    p = FaultPlan().raise_error("n2", 5, "backward").raise_error("n2", 7, "recovery").raise_error("n3", 5)
    p = p.add(node="n2", step=9, phase="transfer", action="raise", after=True)
    return p.recorded_in(tmp_path) if tmp_path else p


def fires(injector: FaultInjector, phase: str, step: int) -> bool:
    try:
        injector.hit(phase, step)  # type: ignore[arg-type]
    except InjectedFault:
        return True
    return False


def test_a_worker_fires_only_its_own_faults_at_their_step_and_phase() -> None:
    n2 = FaultInjector(plan(), "n2", 0, 0)
    assert not fires(n2, "forward", 5) and not fires(n2, "backward", 4)
    assert fires(n2, "backward", 5) and not fires(n2, "backward", 5)  # once
    assert not fires(n2, "transfer", 8) and fires(n2, "transfer", 12)  # `after`: any later step
    assert not FaultInjector(plan(), "n2", 1, 0).armed  # another local rank
    assert not FaultInjector(plan(), "n2", 0, 1).armed  # a restarted worker


def test_the_plan_and_its_record_travel_in_the_environment(tmp_path: Path) -> None:
    env = plan(tmp_path).to_env()
    back = FaultPlan.from_env(env)
    assert back.faults == plan().faults and back.fired_dir == tmp_path
    assert FaultPlan.from_env(plan().to_env()).fired_dir is None
    assert FaultPlan().to_env() == {}
    with pytest.raises(ConfigError, match="SLURM_ELASTIC_FAULTS"):
        FaultPlan.from_env({"SLURM_ELASTIC_FAULTS": '[{"node": "n1", "step": 0}]'})


def test_with_a_record_a_fault_fires_once_per_job_and_says_so(tmp_path: Path) -> None:
    recorded = plan(tmp_path)
    assert recorded.fired() == [False] * 4
    assert fires(FaultInjector(recorded, "n2", 0, 0), "backward", 5)
    assert recorded.fired() == [True, False, False, False]
    # The node's agent is started again (incarnation 0 anew): what fired does not fire again; the rest does.
    again = FaultInjector(FaultPlan.from_env(recorded.to_env()), "n2", 0, 0)
    assert not fires(again, "backward", 5) and fires(again, "recovery", 7)
    assert recorded.fired() == [True, True, False, False]
    # Two processes racing for the same fault: only one fires it.
    a, b = FaultInjector(recorded, "n3", 0, 0), FaultInjector(recorded, "n3", 0, 0)
    assert fires(a, "forward", 5) and not fires(b, "forward", 5)
    with pytest.raises(ValueError, match="no record"):
        plan().fired()
