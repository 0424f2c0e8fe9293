"""The second batch policy: keep each replica's batch and scale the learning rate with the world."""

from __future__ import annotations

import math

import pytest

from slurm_elastic.eventtypes import GenerationReady
from slurm_elastic.faults import FaultPlan

from .conftest import SLOW, STEPS, Runner

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def test_scaled_learning_rate_follows_the_world_and_data_stays_exactly_once(runner: Runner) -> None:
    plan = FaultPlan().kill("local2", step=6, phase="backward")
    args = ("--per-replica-batch", "8", "--lr-rule", "sqrt")
    res = runner("scale-lr", faults=plan, script=SLOW, script_args=args)
    assert res.result.ok, res.result.reason
    ready = res.of(GenerationReady)
    assert [e.world for e in ready] == [4, 3]
    assert ready[0].lr_factor == 1.0  # the first generation is the reference
    assert ready[1].lr_factor == pytest.approx(math.sqrt(3 / 4))
    assert "scale learning rate (sqrt)" in ready[1].batch_policy
    assert res.ledger is not None
    # 5 steps of 4 x 8 samples, then 11 of 3 x 8; nothing twice, nothing skipped
    assert res.ledger.committed_steps == STEPS
    assert res.ledger.samples_consumed == 5 * 32 + (STEPS - 5) * 24
    assert (res.ledger.duplicate_samples, res.ledger.skipped_samples) == (0, 0)
