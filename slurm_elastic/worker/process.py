"""What the library does to the training process itself: SIGTERM becomes a drain request, an uncaught
exception in the user's code is reported (with its traceback) before the process dies, a misuse of the
job that cannot be raised where it happens (a loop left early) is reported and makes the process exit 1,
and a process that went through recoveries ends without tripping over the process groups it abandoned."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from slurm_elastic.errors import ElasticError, UsageError
from slurm_elastic.logs import drop_unwritable_output
from slurm_elastic.wire.messages import DrainRequest, Failure
from slurm_elastic.worker.membership.comm import leftovers


def failure_signature(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """Type, first line of the message and innermost place: equal for the same bug on any rank."""
    frames = traceback.extract_tb(tb)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"
    first_line = (str(exc).splitlines() or [""])[0][:300]
    return f"{kind.__name__}: {first_line} at {where}"


def _reportable(exc: BaseException) -> bool:
    """The user's own exceptions and misuses of the job; not the library's own endings."""
    if isinstance(exc, KeyboardInterrupt):
        return False
    return isinstance(exc, UsageError) or not isinstance(exc, ElasticError)


def _runnable_threads() -> int:
    """Threads of this process, other than the caller, that are running or waiting for a CPU (Linux)."""
    own = threading.get_native_id()
    count = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            if int(tid) != own and stat.rsplit(")", 1)[1].split()[0] == "R":
                count += 1
    return count


def settle_native_threads(limit_s: float = 2.0, poll_s: float = 0.01) -> bool:
    """Wait, without the GIL, until no other thread of the process is runnable twice in a row (at most
    `limit_s`); true if they settled.

    A gloo thread frees a finished collective's tensors after the caller has moved on (the script's last
    `full_tensor()` gathers, say), and that takes the GIL. If it comes to that only once the interpreter is
    finalizing, Python ends the thread inside C++ and the process aborts ("terminate called without an
    active exception"). Sleeping here, at exit while Python still runs, lets such a thread finish first."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
        quiet = quiet + 1 if _runnable_threads() == 0 else 0
    return True


def _flush_output() -> None:
    """What the process wrote, out before an `os._exit`; a full disk under stdout or stderr must not keep the
    process from its exit (an exception in an atexit hook would)."""
    for flush in (logging.shutdown, lambda: sys.stdout.flush(), lambda: sys.stderr.flush()):
        with contextlib.suppress(Exception):
            flush()


class ProcessHooks:
    def __init__(self, node: str, worker_id: str, send: Callable[[BaseModel], None], *, enabled: bool = True) -> None:
        self.node = node
        self.worker_id = worker_id
        self.send = send
        self.enabled = enabled  # off for ranks that are threads of one process: never touch the process
        self.exit_code = 0  # what the process reports if the library has to end it (see atexit)
        self.crashed = False  # an exception escaped the script and the excepthook reported it
        self._reported: list[BaseException] = []  # sent already: the excepthook does not send them again
        self._fail_at_exit = False
        self._lock = threading.Lock()
        self._crash_seen = threading.Event()
        self._pending: tuple[BaseException, str, Callable[[], None]] | None = None

    def report(self, exc: BaseException, signature: str) -> None:
        """Report a failure that is not raised, and make the process exit 1 whatever the script does."""
        text = f"{signature}\n{exc}\n"
        self._reported.append(exc)
        with contextlib.suppress(Exception):  # the connection may be gone already; the exit code still says it
            self.send(
                Failure(
                    worker_id=self.worker_id, signature=signature[:2000], traceback=text[-60_000:],
                    fatal=isinstance(exc, UsageError),
                )
            )  # fmt: skip
        self.exit_code = 1
        self._exit_1_at_exit()

    def report_later(self, exc: BaseException, signature: str, then: Callable[[], None], delay: float = 0.3) -> None:
        """A failure found where it cannot be raised (a loop dropped before its end). An exception on its way
        out of the script drops its loops too, just before the excepthook reports it: so wait `delay` seconds
        for that; without one, report this failure. Then run `then` (leave the job). The process exits 1."""
        with self._lock:
            self._pending = (exc, signature, then)
        self.exit_code = 1
        self._reported.append(exc)  # raised again on a later use of the job: never a second report
        self._exit_1_at_exit()
        threading.Thread(target=self._flush_after, args=(delay,), name="se-report", daemon=True).start()

    def _flush_after(self, delay: float) -> None:
        self._crash_seen.wait(delay)
        self.flush()

    def flush(self) -> None:
        """Carry out a failure left to report (`report_later`), once."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        exc, signature, then = pending
        if not self.crashed:  # else the excepthook reported the exception that dropped the loop
            self.report(exc, signature)
        with contextlib.suppress(Exception):
            then()

    def exit_at_end(self, code: int) -> None:
        """The job ended this worker where no exception can carry it (a loop left at a boundary): the script's
        code after the loop runs, then the process exits with `code`."""
        if code:
            self.exit_code = code
            self._exit_1_at_exit()

    def _exit_1_at_exit(self) -> None:
        if self.enabled and not self._fail_at_exit:
            self._fail_at_exit = True
            atexit.register(self._exit_failed)

    def _exit_failed(self) -> None:
        self.flush()  # the script ended before the delay did
        _flush_output()
        os._exit(self.exit_code or 1)

    def install(self) -> None:
        sys.excepthook = self._report_failure(sys.excepthook)
        # Run last (atexit is LIFO): the library's log lines may sit in stdout's buffer, and Python's flush of
        # it at exit on a full disk would end a worker that did its work with code 120.
        atexit.register(drop_unwritable_output)
        atexit.register(self._exit_without_leftovers)
        self._drain_on_sigterm()

    def _drain_on_sigterm(self) -> None:
        """Slurm signals every process of a step on preemption: leave at the next step boundary instead."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return  # the user's own handler wins

        def on_sigterm(signum: int, frame: object) -> None:
            drain = DrainRequest(nodes=[self.node], mode="boundary", reason="SIGTERM", source="worker")
            # Not from the handler itself: it may interrupt the main thread inside a send holding its lock.
            threading.Thread(target=self.send, args=(drain,), daemon=True).start()

        signal.signal(signal.SIGTERM, on_sigterm)

    def _exit_without_leftovers(self) -> None:
        """Process groups abandoned in a recovery may still block in gloo threads until their timeout; at
        interpreter exit their C++ destructors abort the process. When any are left, end it here instead.
        Else let the native threads settle first (`settle_native_threads`)."""
        if not leftovers():
            settle_native_threads()
            return
        _flush_output()
        os._exit(self.exit_code)

    def _report_failure(self, previous: Callable[..., Any]) -> Callable[..., Any]:
        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            self.exit_code = 1
            if _reportable(exc) and not any(exc is sent for sent in self._reported):
                text = "".join(traceback.format_exception(kind, exc, tb))
                signature = failure_signature(kind, exc, tb)
                fatal = isinstance(exc, UsageError)
                self.send(Failure(worker_id=self.worker_id, signature=signature, traceback=text[-60_000:], fatal=fatal))
                self.crashed = True
            self._crash_seen.set()
            self.flush()  # leave the job now (a dropped loop's own report is not sent)
            previous(kind, exc, tb)

        return hook
