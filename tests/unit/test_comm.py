"""`run_interruptibly`: a blocking call on a helper thread, which the worker's exit counts while it blocks."""

from __future__ import annotations

import threading

import pytest

from slurm_elastic.worker import comm
from slurm_elastic.worker.comm import Interrupt, Interrupted, leftovers, run_interruptibly

pytestmark = pytest.mark.timeout(30)


def helpers(name: str) -> list[threading.Thread]:
    return [t for t in comm._helpers if t.name == f"se-{name}"]


def test_completed_calls_leave_no_helper_thread_behind() -> None:
    interrupt = Interrupt()
    assert [run_interruptibly(lambda i=i: i, interrupt, "call") for i in range(50)] == list(range(50))
    assert len(helpers("call")) < 10  # one thread object per call piled up over a whole run
    for t in helpers("call"):
        t.join(5)
    run_interruptibly(lambda: None, interrupt, "next")
    assert not helpers("call"), "ended helpers are pruned as the next call starts"


def test_an_interrupted_call_still_blocked_is_a_leftover_until_it_ends() -> None:
    release = threading.Event()
    interrupt = Interrupt()
    interrupt.set()
    with pytest.raises(Interrupted):
        run_interruptibly(lambda: release.wait(10), interrupt, "blocked")
    (blocked,) = helpers("blocked")
    assert leftovers()  # the worker's exit would skip interpreter finalization now
    release.set()
    blocked.join(5)
    leftovers()
    assert not helpers("blocked"), "no longer counted once its thread ended"
