"""Restart decisions for crashed workers, and the bound on identical failures."""

from __future__ import annotations

import pytest

from slurm_elastic.decide.failures import (
    ExitRecord,
    identical_failure_verdict,
    last_line,
    never_joined_verdict,
    record_failure,
    restart_decision,
    restart_delay,
)


def test_clean_exit_is_never_restarted() -> None:
    d = restart_decision(0, 0, 3, stopping=False)
    assert not d.restart and d.reason == "exited cleanly"


def test_no_restart_while_stopping() -> None:
    d = restart_decision(1, 0, 3, stopping=True)
    assert not d.restart and "stopping" in d.reason


@pytest.mark.parametrize(("code", "how"), [(1, "exit code 1"), (-9, "killed by signal 9"), (137, "exit code 137")])
def test_crash_within_budget_is_restarted(code: int, how: str) -> None:
    d = restart_decision(code, 1, 3, stopping=False)
    assert d.restart and d.reason == f"{how}; restart 2 of 3 in 0.5 s"


@pytest.mark.parametrize(("done", "limit"), [(3, 3), (4, 3), (0, 0)])
def test_restart_budget_spent(done: int, limit: int) -> None:
    d = restart_decision(-9, done, limit, stopping=False)
    assert not d.restart and d.reason == f"restart budget spent ({done} of {limit})"


def test_last_restart_in_budget() -> None:
    assert restart_decision(2, 2, 3, stopping=False).restart


def test_record_failure_counts_without_mutating() -> None:
    empty: dict[str, int] = {}
    one = record_failure(empty, "ValueError: x")
    two = record_failure(one, "ValueError: x")
    other = record_failure(two, "KeyError: y")
    assert empty == {} and one == {"ValueError: x": 1} and two == {"ValueError: x": 2}
    assert other == {"ValueError: x": 2, "KeyError: y": 1}


def test_identical_failure_verdict_at_the_bound() -> None:
    counts: dict[str, int] = {}
    for _ in range(2):
        counts = record_failure(counts, "RuntimeError: boom")
        counts = record_failure(counts, "KeyError: other")
        assert identical_failure_verdict(counts, 3) is None
    counts = record_failure(counts, "RuntimeError: boom")
    verdict = identical_failure_verdict(counts, 3)
    assert verdict is not None
    assert "3 times" in verdict and "limit 3" in verdict and "RuntimeError: boom" in verdict
    assert "KeyError" not in verdict


def test_a_bound_of_one_stops_at_the_first_failure() -> None:
    assert identical_failure_verdict({}, 1) is None
    assert identical_failure_verdict({"E": 1}, 1) is not None


# --- backoff ------------------------------------------------------------------------------------------


def test_restarts_back_off_after_the_first() -> None:
    assert [restart_delay(n) for n in range(8)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    decision = restart_decision(-9, 2, 5, stopping=False)
    assert decision.restart and decision.delay_s == 1.0 and "in 1 s" in decision.reason


# --- a job none of whose processes joined -----------------------------------------------------------


def ended(
    node: str, code: int = 2, tail: str = "", joined: bool = False, worker: str | None = None, final: bool = True
) -> ExitRecord:
    return ExitRecord(worker or f"{node}:0:3", node, code, tail, joined, final)


TYPO = "Traceback (most recent call last):\n  ...\ntrain.py: error: unrecognized arguments: --lrr 0.1\n"


def test_every_process_failing_alike_in_its_first_start_fails_the_job_at_once() -> None:
    nodes = {"n1": 2, "n2": 2}
    starts = [ended(n, tail=TYPO, worker=f"{n}:{r}:0", final=False) for n in ("n1", "n2") for r in (0, 1)]
    assert never_joined_verdict(nodes, starts[:3], 0) is None, "n2:1 may still start well"
    verdict = never_joined_verdict(nodes, starts, 0)
    assert verdict == (
        "the training command exited with 2 on every node without joining the job: "
        "train.py: error: unrecognized arguments: --lrr 0.1"
    )


def test_a_silent_failure_is_restarted_first() -> None:
    assert never_joined_verdict({"n1": 1}, [ended("n1", code=7, final=False)], 0) is None


def test_a_restart_counts_as_the_same_process_slot() -> None:
    again = [ended("n1", tail=TYPO, worker="n1:0:0", final=False), ended("n1", tail=TYPO, worker="n1:0:1")]
    assert never_joined_verdict({"n1": 2}, again, 0) is None, "n1:1 has not failed yet"


def test_failures_that_differ_wait_for_every_process_to_end_for_good() -> None:
    nodes = {"n1": 1, "n2": 1}
    other = "OSError: [Errno 5] Input/output error\n"
    starts = [ended("n1", tail=TYPO, final=False), ended("n2", tail=other, final=False)]
    assert never_joined_verdict(nodes, starts, 0) is None, "a restart may mend one of them"
    done = [*starts, ended("n1", tail=TYPO), ended("n2", tail=other)]
    verdict = never_joined_verdict(nodes, done, 0)
    assert verdict is not None and verdict.endswith("on n1 without joining the job: " + TYPO.splitlines()[-1])


def test_the_last_line_is_the_exceptions_own() -> None:
    assert last_line(TYPO) == "train.py: error: unrecognized arguments: --lrr 0.1"
    assert last_line("  \n\n") == ""
    assert last_line("x" * 1000, limit=10) == "x" * 10


def test_fails_once_every_node_has_ended_for_good_without_joining() -> None:
    nodes = {"n1": 1, "n2": 1}
    assert never_joined_verdict(nodes, [ended("n1")], registered_alive=0) is None, "n2 may still join"
    verdict = never_joined_verdict(nodes, [ended("n1", tail="can't open file 'x.py'\n"), ended("n2")], 0)
    assert verdict == "the training command exited with 2 on n1 without joining the job: can't open file 'x.py'"


def test_a_clean_exit_without_joining_hints_at_the_missing_library() -> None:
    verdict = never_joined_verdict({"n1": 1}, [ended("n1", code=0)], 0)
    assert verdict is not None and "exited with 0" in verdict and "slurm_elastic.ElasticJob" in verdict


def test_a_signal_is_named_and_the_tail_is_one_short_line() -> None:
    verdict = never_joined_verdict({"n1": 1}, [ended("n1", code=-9, tail="x\n" * 1000)], 0)
    assert verdict is not None and "killed by signal 9" in verdict and "\n" not in verdict and len(verdict) < 400


@pytest.mark.parametrize(
    ("exits", "alive"),
    [
        ([ended("n1", joined=True)], 0),  # someone joined: the job can run without this one
        ([ended("n1")], 1),  # a registered process is still alive
        ([ended("n1", worker="n1:0:0")], 0),  # one of n1's two processes is still to end
    ],
)
def test_no_verdict_while_the_job_may_still_run(exits: list[ExitRecord], alive: int) -> None:
    nproc = {"n1": 2} if exits[0].worker == "n1:0:0" else {"n1": 1}
    assert never_joined_verdict(nproc, exits, alive) is None
