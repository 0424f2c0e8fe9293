"""wait_until: the first true value, or one line naming what was awaited and why the wait ended."""

from __future__ import annotations

import itertools

import pytest

from slurm_elastic.errors import ElasticError
from slurm_elastic.waiting import WaitTimedOut, holds_within, wait_until


def test_it_returns_the_first_true_value_the_check_gives() -> None:
    calls = itertools.count()
    assert wait_until(lambda: next(calls) >= 3 and "ready", timeout=30, what="three calls", poll=0) == "ready"
    assert next(calls) == 4  # polled until true, then not again


def test_out_of_time_it_names_what_it_waited_for() -> None:
    with pytest.raises(WaitTimedOut, match=r"^timed out after 0.05 s waiting for the moon$") as caught:
        wait_until(lambda: None, timeout=0.05, what="the moon", poll=0.01)
    assert isinstance(caught.value, ElasticError) and isinstance(caught.value, TimeoutError)


def test_a_reason_to_give_up_ends_the_wait_at_once_with_that_reason() -> None:
    calls = itertools.count()
    with pytest.raises(WaitTimedOut, match=r"^gave up waiting for step 9: phase failed$"):
        wait_until(lambda: False, timeout=3600, what="step 9", give_up=lambda: "phase failed" if next(calls) else None)
    assert next(calls) == 2  # the first check went on, the second gave up


def test_a_check_that_is_true_at_once_wins_over_a_reason_to_give_up() -> None:
    assert wait_until(lambda: 1, timeout=0, what="x", give_up=lambda: "ended") == 1


def test_holds_within_says_whether_the_check_came_true_and_never_raises() -> None:
    calls = itertools.count()
    assert holds_within(lambda: next(calls) >= 2, timeout=30, poll=0)
    assert next(calls) == 3
    assert not holds_within(lambda: False, timeout=0.05, poll=0.01)
    assert not holds_within(lambda: False, timeout=-5.0, poll=0.01)  # a deadline already past: one check, false
    assert holds_within(lambda: True, timeout=-5.0)
