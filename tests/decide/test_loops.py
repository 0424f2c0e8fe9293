"""Every member runs the same loop: the comparison of two workers' loop settings, and the step a member is in
by its heartbeat (decide.loops)."""

from __future__ import annotations

import pytest

from slurm_elastic.decide.loops import TAKEN, loop_difference, step_taken

LOOP = {"total_steps": 100, "global_batch": 64, "micro_batch": 8, "seed": 0, "shuffle": True, "lr": None}


def test_the_same_loop_has_no_difference() -> None:
    assert loop_difference("a", LOOP, "b", dict(LOOP)) is None


def test_each_difference_is_named_with_both_sides_in_one_line() -> None:
    other = {**LOOP, "total_steps": 150, "micro_batch": 4}
    text = loop_difference("n1/0", LOOP, "n3/0", other)
    assert text is not None and "\n" not in text
    assert "micro_batch 8 on n1/0, 4 on n3/0; total_steps 100 on n1/0, 150 on n3/0;" in text
    assert "global_batch" not in text and "job.step on a rank that joined later" in text


def test_a_setting_one_side_lacks_is_a_difference() -> None:
    epochs = {k: v for k, v in LOOP.items() if k != "total_steps"} | {"total_epochs": 3, "lr": "linear"}
    text = loop_difference("a", LOOP, "b", epochs)
    assert text is not None
    assert "lr (none) on a, 'linear' on b" in text
    assert "total_epochs (none) on a, 3 on b" in text and "total_steps 100 on a, (none) on b" in text


@pytest.mark.parametrize("phase", ["init", "compute", "recovery", "boundary", "done", *sorted(TAKEN)])
def test_a_heartbeat_proves_a_step_taken_only_after_its_last_backward(phase: str) -> None:
    # compute: the step's first micro-batch was handed out, and a loop may still leave at the boundary
    assert step_taken(7, phase) == (8 if phase in ("allreduce", "optimizer", "commit") else 7)
