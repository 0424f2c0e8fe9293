"""Restart decisions for crashed workers, and the bound on identical failures."""

from __future__ import annotations

import pytest

from slurm_elastic.decide.failures import identical_failure_verdict, record_failure, restart_decision


def test_clean_exit_is_never_restarted() -> None:
    d = restart_decision(0, 0, 3, stopping=False)
    assert not d.restart and d.reason == "exited cleanly"


def test_no_restart_while_stopping() -> None:
    d = restart_decision(1, 0, 3, stopping=True)
    assert not d.restart and "stopping" in d.reason


@pytest.mark.parametrize(("code", "how"), [(1, "exit code 1"), (-9, "killed by signal 9"), (137, "exit code 137")])
def test_crash_within_budget_is_restarted(code: int, how: str) -> None:
    d = restart_decision(code, 1, 3, stopping=False)
    assert d.restart and d.reason == f"{how}; restart 2 of 3"


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
