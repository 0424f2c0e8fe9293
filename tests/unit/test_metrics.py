from __future__ import annotations

import pytest
import torch

from slurm_elastic.eventtypes import Commit
from slurm_elastic.showcase.metrics import max_param_rel_diff, median, recovery_after


def C(step: int, worker_time: float) -> Commit:
    return Commit(step, generation=1, world=1, loss=0.0, samples=0, worker_time=worker_time, received=worker_time)


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


def test_a_commit_reads_back_from_its_event_and_from_an_older_event() -> None:
    commit = Commit(7, generation=2, world=3, loss=1.5, samples=96, worker_time=10.0, received=10.25)
    event = {"kind": "commit", "ts": 10.3, **commit.__dict__}
    assert Commit.from_event(event) == commit
    older = {"kind": "commit", "step": 7, "generation": 2, "world": 3, "loss": 1.5, "worker_time": 10.0}
    assert Commit.from_event(older) == Commit(7, 2, 3, 1.5, samples=0, worker_time=10.0, received=10.0)
