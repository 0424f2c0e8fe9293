from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from slurm_elastic.showcase.metrics import max_param_rel_diff, median, recovery_after


@dataclass(frozen=True)
class C:
    step: int
    worker_time: float


def test_recovery_is_the_first_commit_past_the_last_step_before_the_kill() -> None:
    commits = [C(1, 1.0), C(2, 2.0), C(3, 3.5), C(4, 4.0)]
    rec = recovery_after(2.5, commits)
    assert (rec.last_step_before, rec.recovered_step) == (2, 3)
    assert rec.mttr_s == pytest.approx(1.0)
    assert rec.lost_steps == 0


def test_a_commit_that_a_restart_rolls_back_is_not_a_recovery() -> None:
    # step 3 commits just after the kill, then the job restarts from the checkpoint at step 0 and replays
    commits = [C(1, 1.0), C(2, 2.0), C(3, 2.01), C(1, 8.0), C(2, 8.1), C(3, 8.2), C(4, 8.3)]
    rec = recovery_after(2.0005, commits)
    assert rec.last_step_before == 2
    assert rec.recovered_step == 3 and rec.mttr_s == pytest.approx(8.2 - 2.0005)
    assert rec.lost_steps == 2  # steps 1 and 2 were committed twice


def test_no_recovery_yet() -> None:
    assert recovery_after(5.0, [C(1, 1.0), C(2, 2.0)]).mttr_s is None


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([]) is None


def test_param_diff() -> None:
    a = {"w": torch.tensor([1.0, -2.0]), "b": torch.zeros(2)}
    assert max_param_rel_diff(a, a) == 0.0
    b = {"w": torch.tensor([1.0, -2.2]), "b": torch.zeros(2)}
    assert max_param_rel_diff(b, a) == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="differ in their tensors"):
        max_param_rel_diff({"w": a["w"]}, a)
