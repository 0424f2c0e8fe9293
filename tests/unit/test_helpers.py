"""The helper threads that make blocking calls for the training thread (worker/membership/helpers.py)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

import pytest
import torch

from slurm_elastic.worker.membership.comm import (
    AWAITED,
    Awaited,
    Interrupt,
    Interrupted,
    leftovers,
    run_interruptibly,
    settle,
)
from slurm_elastic.worker.membership.helpers import HELPERS, Helpers


def _run(pool: Helpers, call: object) -> threading.Event:
    done = threading.Event()
    pool.submit(call, done.set, "test")  # type: ignore[arg-type]
    return done


def test_calls_one_after_another_reuse_one_helper() -> None:
    pool, seen = Helpers(), []
    for i in range(20):
        assert _run(pool, lambda i=i: seen.append(i)).wait(5)
    assert seen == list(range(20))
    assert (pool.started, pool.served, pool.busy()) == (1, 20, 0)


def test_a_blocked_call_keeps_its_helper_and_the_next_call_gets_another() -> None:
    pool, release = Helpers(), threading.Event()
    blocked = _run(pool, lambda: release.wait(10))
    assert _run(pool, lambda: None).wait(5)
    assert (pool.started, pool.busy()) == (2, 1)
    release.set()
    assert blocked.wait(5)
    assert pool.busy() == 0
    for _ in range(5):  # both idle now: no third thread
        assert _run(pool, lambda: None).wait(5)
    assert pool.started == 2


def test_a_call_that_raises_is_reported_still_finishes_and_its_helper_serves_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool = Helpers()

    def boom() -> None:
        raise RuntimeError("the call failed")

    assert _run(pool, boom).wait(5)
    assert _run(pool, lambda: None).wait(5)
    assert (pool.started, pool.busy()) == (1, 0)
    assert "RuntimeError: the call failed" in capsys.readouterr().err


def test_an_interrupted_call_is_a_leftover_until_it_returns() -> None:
    interrupt, release = Interrupt(), threading.Event()
    threading.Timer(0.05, interrupt.set).start()
    with pytest.raises(Interrupted):
        run_interruptibly(lambda: release.wait(10), interrupt, "stuck collective")
    assert HELPERS.busy() >= 1 and leftovers()
    release.set()
    for _ in range(500):
        if not HELPERS.busy():
            break
        threading.Event().wait(0.01)
    assert HELPERS.busy() == 0
    assert run_interruptibly(lambda: 42, Interrupt(), "next call") == 42


def test_a_forked_child_starts_its_own_helper() -> None:
    assert run_interruptibly(lambda: 1, Interrupt(), "before the fork") == 1  # an idle helper exists now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's helper threads were not copied
        try:
            value = run_interruptibly(lambda: 7, Interrupt(), "in the child")
            os.write(write, bytes([value, HELPERS.busy()]))
        finally:
            os._exit(0)
    os.close(write)
    try:
        got = b""
        if select.select([read], [], [], 10)[0]:
            got = os.read(read, 2)
    finally:
        os.close(read)
        if not got:  # stuck on a helper that does not exist in the child
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert got == bytes([7, 0]), "the child's call never ran"


def test_settle_waits_for_blocked_calls_within_its_bound() -> None:
    pool, release = Helpers(), threading.Event()
    blocked = _run(pool, lambda: release.wait(10))
    assert pool.settle(timeout_s=0.05) == 1  # still blocked: settle gives up after its bound
    threading.Timer(0.1, release.set).start()
    assert pool.settle(timeout_s=10) == 0
    assert blocked.wait(5)
    assert Helpers().settle(timeout_s=0) == 0  # nothing to wait for


def test_awaited_collectives_count_until_their_callback_ran() -> None:
    awaited, future, woken = Awaited(), torch.futures.Future(), threading.Event()
    awaited.on_completion(future, woken.set)
    assert awaited.count() == 1 and awaited.settle(timeout_s=0.05) == 1
    threading.Timer(0.1, future.set_result, args=(None,)).start()
    assert awaited.settle(timeout_s=10) == 0
    assert woken.is_set()


def test_a_raising_callback_is_still_counted_as_run() -> None:
    awaited, future = Awaited(), torch.futures.Future()

    def boom() -> None:
        raise RuntimeError("callback failed")

    awaited.on_completion(future, boom)
    with contextlib.suppress(RuntimeError):  # torch may report the callback's error where it ran
        future.set_result(None)
    assert awaited.count() == 0


def test_settle_reports_whether_everything_returned() -> None:
    release = threading.Event()
    blocked = threading.Event()
    HELPERS.submit(lambda: release.wait(10), blocked.set, "test")
    assert settle(timeout_s=0.05) is False and leftovers()
    release.set()
    assert settle(timeout_s=10) is True
    assert blocked.wait(5)


def test_a_forked_child_awaits_none_of_its_parents_collectives() -> None:
    future = torch.futures.Future()
    AWAITED.on_completion(future, lambda: None)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(10 + AWAITED.count())  # 10: the child awaits nothing
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 10
        assert AWAITED.count() >= 1  # the parent still does
    finally:
        future.set_result(None)
