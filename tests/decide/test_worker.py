"""The worker's "what next" reducer over every situation, and how each announcement ends a worker."""

from __future__ import annotations

import itertools

import pytest

from slurm_elastic.decide import worker as w

OUTCOMES: tuple[w.AttemptOutcome, ...] = ("none", "committed", "aborted", "failed")


def expected(s: w.Situation) -> type:
    """The rule, written independently of the implementation's order of checks."""
    if s.attempt in ("failed", "aborted") or s.superseded:
        return w.Recover
    if s.committed >= s.total or s.stop_asked:
        return w.Finish
    return w.CrossBoundary if s.boundary_due else w.RunStep


@pytest.mark.parametrize(
    ("attempt", "superseded", "boundary_due", "committed", "stop"),
    list(itertools.product(OUTCOMES, (False, True), (False, True), (0, 4, 5, 6), (False, True))),
)
def test_every_situation_has_one_move(
    attempt: w.AttemptOutcome, superseded: bool, boundary_due: bool, committed: int, stop: bool
) -> None:
    detail = "peer gone" if attempt == "failed" else ""
    s = w.Situation(committed, 5, attempt, superseded, boundary_due, detail, stop_asked=stop)
    move = w.next_move(s)
    assert type(move) is expected(s), (s, move)
    assert move.reason


def test_a_failed_collective_recovers_with_its_detail_and_asks_the_coordinator() -> None:
    move = w.next_move(w.Situation(3, 10, "failed", False, False, "allreduce: connection reset"))
    assert move == w.Recover("allreduce: connection reset", patient=False)


def test_a_superseded_generation_wins_over_finishing() -> None:
    # Committing the last step while a newer generation exists: peers may still need this replica's state.
    move = w.next_move(w.Situation(10, 10, "committed", True, False))
    assert isinstance(move, w.Recover) and move.reason == "generation superseded"


def test_the_last_step_finishes_even_with_a_boundary_due() -> None:
    assert isinstance(w.next_move(w.Situation(10, 10, "committed", False, True)), w.Finish)


def test_run_step_names_the_next_step() -> None:
    assert w.next_move(w.Situation(3, 10, "committed", False, False)) == w.RunStep("step 4 of 10")


# --- endings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rank", "holds", "checkpoints", "save"),
    [(0, True, True, True), (1, True, True, False), (0, False, True, False), (0, True, False, False)],
)
def test_a_stop_without_error_saves_a_checkpoint_only_on_rank_0_holding_state(
    rank: int, holds: bool, checkpoints: bool, save: bool
) -> None:
    end = w.ending_for_stop("suspended", None, rank=rank, holds_state=holds, checkpoints=checkpoints)
    assert (end.kind, end.code, end.save_checkpoint) == ("stopped", w.EXIT_OK, save)
    assert "suspended" in end.reason


def test_a_stop_with_an_error_fails_the_worker_and_saves_nothing() -> None:
    end = w.ending_for_stop("failed", "all members lost", rank=0, holds_state=True, checkpoints=True)
    assert (end.kind, end.code, end.save_checkpoint) == ("job_failed", w.EXIT_JOB_FAILED, False)
    assert "all members lost" in end.reason


def test_a_stop_asked_alone_finishes_at_the_boundary_and_says_where() -> None:
    move = w.next_move(w.Situation(3, 10, "committed", False, True, stop_asked=True))
    assert move == w.Finish("job.stop() after step 3")


def test_other_endings_and_their_codes() -> None:
    complete = w.ending_for_complete("training ended at step 9")
    assert (complete.kind, complete.code, complete.save_checkpoint) == ("complete", w.EXIT_OK, False)
    assert w.ending_for_leave("drained").code == w.EXIT_OK
    lost = w.ending_for_lost_coordinator("connection closed")
    assert (lost.kind, lost.code) == ("coordinator_lost", w.EXIT_COORDINATOR_LOST)
    over = w.ending_for_refused_registration("job over")
    assert (over.kind, over.code) == ("job_over", w.EXIT_OK)
    codes = {w.EXIT_OK, w.EXIT_JOB_FAILED, w.EXIT_COORDINATOR_LOST}
    assert len(codes) == 3, "each kind of failure has its own exit code"
