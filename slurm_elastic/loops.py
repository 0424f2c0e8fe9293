"""Long-lived control loops (threads, asyncio tasks) that never end silently.

A control loop that dies of an exception takes its duty with it: a coordinator's ticker that stopped sent no
more pulses, and a lease later every agent declared the coordinator lost, with no word of why. Every
control loop therefore starts through `start_thread` or `run_loudly`: if its body raises, the traceback is
logged and `on_death` gets one line naming the loop and the error, for its owner to fail loudly with
(the coordinator fails the job, an agent exits non-zero, a worker leaves the job: each says why).
"""

from __future__ import annotations

import asyncio
import threading
import traceback
from collections.abc import Awaitable, Callable

from slurm_elastic.logs import get_logger

log = get_logger("slurm_elastic.loops")
OnDeath = Callable[[str], None]


def death_reason(name: str, exc: BaseException) -> str:
    return f"{name} died: {type(exc).__name__}: {exc}"[:1000]


def died(name: str, exc: BaseException, on_death: OnDeath) -> None:
    """The loop `name` ended with `exc`: log its traceback and tell its owner. `start_thread` and `run_loudly`
    call it; a loop that is its process's main loop (the Slurm launcher's) calls it itself."""
    reason = death_reason(name, exc)
    log.error("control_loop_died", loop=name, reason=reason, traceback="".join(traceback.format_exception(exc)))
    try:
        on_death(reason)
    except Exception as second:  # the owner could not act on it: at least the log says both
        log.error("control_loop_death_not_handled", loop=name, reason=reason, error=repr(second))


def start_thread(name: str, body: Callable[[], object], on_death: OnDeath) -> threading.Thread:
    """Run `body` on a daemon thread called `name`; if it raises, `on_death(reason)`."""

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # SystemExit too: a thread that ends that way still ends its duty
            died(f"the {name} thread", exc, on_death)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


async def run_loudly(body: Awaitable[object], name: str, on_death: OnDeath) -> None:
    """Await `body` (an asyncio task's coroutine); if it raises, `on_death(reason)`. Cancellation is an
    ordinary end (a shutdown), not a death."""
    try:
        await body
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        died(name, exc, on_death)


__all__ = ["death_reason", "died", "run_loudly", "start_thread"]
