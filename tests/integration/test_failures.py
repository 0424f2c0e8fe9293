"""Exceptions in the user's own code: retried a bounded number of times, then reported."""

from __future__ import annotations

import pytest
import torch

from slurm_elastic.faults import FaultPlan

from .conftest import Runner, assert_same_training

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def test_identical_failures_stop_the_job_with_the_traceback(runner: Runner) -> None:
    plan = FaultPlan()
    for node in ("local1", "local2", "local3", "local4"):
        plan = plan.raise_error(node, step=4, phase="forward")
    res = runner("user-bug", faults=plan, max_restarts=5)
    assert res.result.phase == "failed"
    assert "same failure happened" in res.result.reason
    assert res.result.failure_traceback and "InjectedFault" in res.result.failure_traceback
    assert len(res.events_of("user_failure")) >= 3
    assert all(code is not None for code in res.result.agent_exit_codes.values())  # nothing left running


def test_one_transient_failure_is_retried(runner: Runner, reference: dict[str, torch.Tensor]) -> None:
    res = runner("transient", faults=FaultPlan().raise_error("local2", step=5, phase="backward"), max_restarts=2)
    assert_same_training(res, reference)
    assert len(res.events_of("user_failure")) == 1
