"""SIGKILL of workers in every phase of a step, several at once, and during recovery."""

from __future__ import annotations

import pytest
import torch

from slurm_elastic.eventtypes import GenerationReady, MembershipChange, Recovered
from slurm_elastic.faults import FaultPlan

from .conftest import FP32_TOLERANCE, SLOW, Runner, assert_same_training, membership_changes

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


PHASES = ["forward", "backward", "bucket", "allreduce", "optimizer", "commit"]


@pytest.mark.parametrize("phase", PHASES)
def test_kill_one_worker_in_each_phase(runner: Runner, reference: dict[str, torch.Tensor], phase: str) -> None:
    res = runner(f"kill-{phase}", faults=FaultPlan().kill("local2", step=6, phase=phase))  # type: ignore[arg-type]
    assert_same_training(res, reference)
    changes = membership_changes(res)
    assert changes[0] == ("start", 0, 4)
    assert changes[1][1:] == (4, 3), changes
    assert len(res.of(Recovered)) == 1
    ready = [e for e in res.of(GenerationReady) if e.generation == 2]
    assert ready and ready[0].lost_committed_steps == 0


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
    assert max(e.generation for e in res.of(MembershipChange)) >= 3


def test_worker_restarted_after_kill_rejoins(runner: Runner, reference: dict[str, torch.Tensor]) -> None:
    plan = FaultPlan().kill("local3", step=4, phase="backward")
    res = runner("restart-rejoin", faults=plan, max_restarts=1, script=SLOW, script_args=("--pause", "1.0"))
    assert_same_training(res, reference)
    worlds = [w for _, _, w in membership_changes(res)]
    assert worlds[:2] == [4, 3] and worlds[-1] == 4
    join = [e for e in res.of(GenerationReady) if e.cause == "join"]
    assert join and join[0].bytes > 0 and join[0].receivers


# --- the same faults in the default float32 mode ----------------------------------------------------------

FP32 = {"reduce_dtype": "float32"}


def assert_close_training(res: object, reference: dict[str, torch.Tensor]) -> None:
    assert_same_training(res, reference, tolerance=FP32_TOLERANCE)  # type: ignore[arg-type]


@pytest.mark.parametrize("phase", PHASES)
def test_float32_kill_one_worker_in_each_phase(
    runner: Runner, reference_fp32: dict[str, torch.Tensor], phase: str
) -> None:
    res = runner(f"fp32-kill-{phase}", faults=FaultPlan().kill("local2", step=6, phase=phase), **FP32)  # type: ignore[arg-type]
    assert_close_training(res, reference_fp32)
    assert membership_changes(res)[1][1:] == (4, 3)
    ready = [e for e in res.of(GenerationReady) if e.generation == 2]
    assert ready and ready[0].lost_committed_steps == 0 and ready[0].reduce_dtype == "float32"
    assert ready[0].buckets is not None and ready[0].buckets > 1, "several overlapped sums per step"


def test_float32_kill_two_nodes_at_once_and_one_during_recovery(
    runner: Runner, reference_fp32: dict[str, torch.Tensor]
) -> None:
    plan = (
        FaultPlan()
        .kill_node("local2", step=5, phase="bucket")
        .kill_node("local4", step=5, phase="bucket")
        .kill("local3", step=5, phase="recovery")
    )
    res = runner("fp32-kill-three", faults=plan, **FP32)
    assert_close_training(res, reference_fp32)
    assert membership_changes(res)[-1][2] == 1


def test_float32_hang_is_evicted(runner: Runner, reference_fp32: dict[str, torch.Tensor]) -> None:
    res = runner("fp32-hang", faults=FaultPlan().stop("local2", step=6, phase="backward"), **FP32)
    assert_close_training(res, reference_fp32)
    assert [e["worker"] for e in res.events_of("hang_evicted")] == ["local2:0:0"]


def test_float32_restarted_worker_rejoins(runner: Runner, reference_fp32: dict[str, torch.Tensor]) -> None:
    plan = FaultPlan().kill("local3", step=4, phase="bucket")
    res = runner(
        "fp32-restart-rejoin", faults=plan, max_restarts=1, script=SLOW, script_args=("--pause", "1.0"), **FP32
    )
    assert_close_training(res, reference_fp32)
    worlds = [w for _, _, w in membership_changes(res)]
    assert worlds[:2] == [4, 3] and worlds[-1] == 4
