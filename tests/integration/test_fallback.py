"""When every holder of the training state is lost, a job with disaster-recovery checkpoints restarts its
workers from the latest one (one event says how many steps are replayed) and still ends with the uninterrupted
run's model, every sample counted once; without checkpoints the error says what would have saved it."""

from __future__ import annotations

import pytest
import torch

from slurm_elastic.eventtypes import CheckpointFallback
from slurm_elastic.faults import FaultPlan

from .conftest import Runner, assert_same_training

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def every_worker_killed(step: int, nodes: int = 3) -> FaultPlan:
    plan = FaultPlan()
    for i in range(1, nodes + 1):
        plan = plan.kill(f"local{i}", step=step, phase="backward")
    return plan


def test_all_holders_lost_resumes_from_the_latest_checkpoint(
    runner: Runner, reference: dict[str, torch.Tensor], tmp_path: object
) -> None:
    res = runner(
        "fallback",
        nodes=3,
        faults=every_worker_killed(step=11),
        max_restarts=2,  # the agents start their workers again; those load the checkpoint of step 8
        checkpoint_dir=tmp_path / "ckpt",  # type: ignore[operator]
        checkpoint_every=4,
    )
    assert_same_training(res, reference)
    (fallback,) = res.of(CheckpointFallback)
    assert fallback.resume_step == 8 and fallback.last_committed_step == 10
    assert fallback.replayed_steps == 2
    assert res.events_of("restart_all") and not res.events_of("job_failed")


def test_all_holders_lost_without_checkpoints_fails_and_names_the_remedy(runner: Runner) -> None:
    res = runner("no-fallback", nodes=2, faults=every_worker_killed(step=5, nodes=2), max_restarts=2)
    assert res.result.phase == "failed"
    assert "no peer holds the training state" in res.result.reason and "--checkpoint-dir" in res.result.reason
