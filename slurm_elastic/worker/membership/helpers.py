"""Long-lived threads that make blocking calls for the training thread, so that its wait can be interrupted.

torch cannot cancel a blocked call (a gloo send, recv or reduce-scatter without a future, a store get), so
such a call runs on a helper while the training thread waits on an event (`comm.run_interruptibly`). A
sharded step makes a dozen of them. Started afresh for each, the threads cost a start per call, and the set
that tracked them grew by as many each step, for the life of the job. A helper instead serves one call at a
time and then waits for the next. One left blocked by an abandoned generation stays busy (a leftover, see
`comm.leftovers`) until its call returns, and later calls go to other helpers.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import traceback
from collections.abc import Callable

Call = Callable[[], object]


class _Helper:
    def __init__(self, pool: Helpers) -> None:
        self._pool = pool
        self.calls: queue.SimpleQueue[tuple[Call, Call, str]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="se-helper", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            call, finished, what = self.calls.get()
            self.thread.name = f"se-{what}"  # what a stack dump of a stuck worker should say
            try:
                call()
            except BaseException:  # calls keep their own errors (run_interruptibly does); never lose the thread
                with contextlib.suppress(Exception):  # nor to a stderr that cannot be written
                    traceback.print_exc()
            finally:
                self.thread.name = "se-helper"
                self._pool._release(self)
                finished()  # after the release: whoever wakes up sees this helper idle


class Helpers:
    """Idle helpers are reused; a new one starts only when every helper is busy."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._idle: list[_Helper] = []
        self._busy = 0
        self.started = 0  # helper threads started
        self.served = 0  # calls submitted

    def submit(self, call: Call, finished: Call, what: str) -> None:
        """Run `call` on a helper, then `finished` (also when `call` raised)."""
        with self._lock:
            helper = self._idle.pop() if self._idle else None
            self._busy += 1
            self.served += 1
            if helper is None:
                self.started += 1
        if helper is None:
            helper = _Helper(self)
        helper.calls.put((call, finished, what))

    def busy(self) -> int:
        """Helpers inside a call now (blocked ones included)."""
        with self._lock:
            return self._busy

    def settle(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every call to return; the number still inside one (see `comm.settle`)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._busy, timeout_s)
            return self._busy

    def _release(self, helper: _Helper) -> None:
        with self._lock:
            self._busy -= 1
            self._idle.append(helper)
            self._lock.notify_all()

    def _forget(self) -> None:
        """In a forked child: the helpers' threads were not copied, so a call queued to one would never run."""
        self._lock = threading.Condition()
        self._idle, self._busy = [], 0


HELPERS = Helpers()
os.register_at_fork(after_in_child=HELPERS._forget)

__all__ = ["HELPERS", "Helpers"]
