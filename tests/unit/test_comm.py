"""`run_interruptibly`: a blocking call on a helper thread, which the worker's exit counts while it blocks."""

from __future__ import annotations

import threading

import pytest

from slurm_elastic.worker import comm
from slurm_elastic.worker.comm import Interrupt, Interrupted, leftovers, run_interruptibly

pytestmark = pytest.mark.timeout(30)


def test_completed_calls_leave_no_helper_thread_behind() -> None:
    interrupt = Interrupt()
    assert [run_interruptibly(lambda i=i: i, interrupt, "call") for i in range(50)] == list(range(50))
    calls = [t for t in comm._helpers if t.name == "se-call"]
    assert len(calls) < 10  # one thread object per call piled up over a whole run
    for t in calls:
        t.join(5)
    assert not leftovers()  # counted only while its thread had not ended


def test_an_interrupted_call_still_blocked_is_a_leftover_until_it_ends() -> None:
    release = threading.Event()
    interrupt = Interrupt()
    interrupt.set()
    with pytest.raises(Interrupted):
        run_interruptibly(lambda: release.wait(10), interrupt, "blocked")
    assert leftovers()
    blocked = [t for t in comm._helpers if t.name == "se-blocked"]
    release.set()
    for t in blocked:
        t.join(5)
    assert not leftovers()
