"""SIGKILL of workers in every phase of a step, several at once, and during recovery."""

from __future__ import annotations

import pytest
import torch

from slurm_elastic.faults import FaultPlan

from .conftest import SLOW, Runner, assert_same_training, membership_changes

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


@pytest.mark.parametrize("phase", ["forward", "backward", "allreduce", "optimizer", "commit"])
def test_kill_one_worker_in_each_phase(runner: Runner, reference: dict[str, torch.Tensor], phase: str) -> None:
    res = runner(f"kill-{phase}", faults=FaultPlan().kill("local2", step=6, phase=phase))  # type: ignore[arg-type]
    assert_same_training(res, reference)
    changes = membership_changes(res)
    assert changes[0] == ("start", 0, 4)
    assert changes[1][1:] == (4, 3), changes
    assert len(res.events_of("recovered")) == 1
    ready = [e for e in res.events_of("generation_ready") if e["generation"] == 2]
    assert ready and ready[0]["lost_committed_steps"] == 0


def test_kill_two_nodes_at_once(runner: Runner, reference: dict[str, torch.Tensor]) -> None:
    plan = FaultPlan().kill_node("local2", step=6, phase="backward").kill_node("local4", step=6, phase="backward")
    res = runner("kill-two", faults=plan)
    assert_same_training(res, reference)
    assert membership_changes(res)[-1][2] == 2


def test_kill_during_recovery(runner: Runner, reference: dict[str, torch.Tensor]) -> None:
    # local2 dies in step 6; while the survivors form generation 2, local3 dies too.
    plan = FaultPlan().kill("local2", step=6, phase="forward").kill("local3", step=6, phase="recovery")
    res = runner("kill-in-recovery", faults=plan)
    assert_same_training(res, reference)
    worlds = [w for _, _, w in membership_changes(res)]
    assert worlds[0] == 4 and worlds[-1] == 2
    assert max(e["generation"] for e in res.events_of("membership_change")) >= 3


def test_worker_restarted_after_kill_rejoins(runner: Runner, reference: dict[str, torch.Tensor]) -> None:
    plan = FaultPlan().kill("local3", step=4, phase="backward")
    res = runner("restart-rejoin", faults=plan, max_restarts=1, script=SLOW, script_args=("--pause", "0.7"))
    assert_same_training(res, reference)
    worlds = [w for _, _, w in membership_changes(res)]
    assert worlds[:2] == [4, 3] and worlds[-1] == 4
    join = [e for e in res.events_of("generation_ready") if e["cause"] == "join"]
    assert join and join[0]["bytes"] > 0 and join[0]["receivers"]
