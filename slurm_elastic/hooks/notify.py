"""Tell a job's coordinator that nodes leave it, within a hard time bound.

`wire.request` bounds each socket operation, not the whole exchange; the request runs on a daemon
thread so that a coordinator that accepts and then stalls still costs at most `timeout_s`. An
unreachable coordinator is a result to log, never a reason to make Slurm wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.jobdir import JobHandle

__all__ = ["NotifyResult", "Source", "notify"]

Source = Literal["prolog", "epilog", "healthcheck", "epilog_slurmctld"]
Mode = Literal["boundary", "now"]
MAX_REASON = 500


@dataclass(frozen=True)
class NotifyResult:
    result: str  # ok | refused | unreachable | timeout | error
    detail: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.result == "ok"


def _exchange(
    handle: JobHandle, nodes: Sequence[str], mode: Mode, reason: str, source: Source, timeout_s: float
) -> tuple[str, str]:
    # Imported here: pydantic and asyncio cost a tenth of a second, paid only when there is news to send.
    from slurm_elastic.errors import AuthError, ProtocolError
    from slurm_elastic.wire.channel import request
    from slurm_elastic.wire.messages import Ack, DrainRequest

    message = DrainRequest(nodes=list(nodes), mode=mode, reason=reason[:MAX_REASON], source=source)
    try:
        answer = request(handle.address, message, secret=handle.secret, job_id=handle.job_id, timeout=timeout_s)
    except AuthError as exc:
        return "refused", str(exc)
    except ProtocolError as exc:
        return "error", str(exc)
    except (TimeoutError, OSError) as exc:
        kind = "timeout" if isinstance(exc, TimeoutError) else "unreachable"
        return kind, f"{type(exc).__name__}: {exc}"
    if not isinstance(answer, Ack):
        return "error", f"unexpected answer {answer.type!r}"
    return ("ok" if answer.ok else "refused"), answer.detail


def notify(
    handle: JobHandle,
    nodes: Sequence[str],
    mode: Mode,
    reason: str,
    source: Source,
    *,
    timeout_s: float = 2.0,
) -> NotifyResult:
    """Send one DrainRequest and wait for its Ack, for at most `timeout_s` seconds in all."""
    started = time.monotonic()
    outcome: list[tuple[str, str]] = []

    def run() -> None:
        try:
            outcome.append(_exchange(handle, nodes, mode, reason, source, timeout_s))
        except Exception as exc:  # a hook must log every failure, never die of one
            outcome.append(("error", f"{type(exc).__name__}: {exc}"))

    thread = threading.Thread(target=run, name="se-hook-notify", daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed = int((time.monotonic() - started) * 1000)
    if not outcome:
        return NotifyResult("timeout", f"no answer from {handle.address} within {timeout_s:g} s", elapsed)
    result, detail = outcome[0]
    return NotifyResult(result, detail, elapsed)
