"""Waiting for a condition: the one deadline-and-poll loop of the package (and of its tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from slurm_elastic.errors import ElasticError

T = TypeVar("T")


class WaitTimedOut(ElasticError, TimeoutError):
    """A wait ended without its condition: out of time, or told that waiting longer is pointless."""


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    poll: float = 0.05,
    give_up: Callable[[], str | None] = lambda: None,
) -> T:
    """Call `check` every `poll` seconds until it returns something true, and return that. `give_up` says
    why waiting on is pointless (the job ended, a process died), or None. Either way out, WaitTimedOut
    names `what` was awaited, in one line."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        reason = give_up()
        if reason is not None:
            raise WaitTimedOut(f"gave up waiting for {what}: {reason}")
        if time.monotonic() > deadline:
            raise WaitTimedOut(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def holds_within(check: Callable[[], object], *, timeout: float, poll: float = 0.05) -> bool:
    """Whether `check` comes true within `timeout` seconds (polled as `wait_until` polls), for a caller that
    goes on either way."""
    try:
        wait_until(check, timeout=max(0.0, timeout), what="a condition", poll=poll)
    except WaitTimedOut:
        return False
    return True
