"""When to restart a crashed worker, and when repeated identical failures must stop the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    reason: str


def restart_decision(returncode: int, restarts_done: int, max_restarts: int, stopping: bool) -> RestartDecision:
    if returncode == 0:
        return RestartDecision(False, "exited cleanly")
    if stopping:
        return RestartDecision(False, "the node or job is stopping")
    if restarts_done >= max_restarts:
        return RestartDecision(False, f"restart budget spent ({restarts_done} of {max_restarts})")
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return RestartDecision(True, f"{how}; restart {restarts_done + 1} of {max_restarts}")


def record_failure(counts: Mapping[str, int], signature: str) -> dict[str, int]:
    return {**counts, signature: counts.get(signature, 0) + 1}


def identical_failure_verdict(counts: Mapping[str, int], max_identical: int) -> str | None:
    """The reason to stop the job, or None while every failure is still below the bound."""
    for signature, n in counts.items():
        if n >= max_identical:
            return f"the same failure happened {n} times (limit {max_identical}): {signature}"
    return None
