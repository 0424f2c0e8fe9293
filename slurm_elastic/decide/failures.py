"""When to restart a crashed worker, and when repeated identical failures must stop the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    reason: str
    delay_s: float = 0.0  # wait this long first: a worker killed again and again is retried with backoff


def restart_decision(returncode: int, restarts_done: int, max_restarts: int, stopping: bool) -> RestartDecision:
    if returncode == 0:
        return RestartDecision(False, "exited cleanly")
    if stopping:
        return RestartDecision(False, "the node or job is stopping")
    if restarts_done >= max_restarts:
        return RestartDecision(False, f"restart budget spent ({restarts_done} of {max_restarts})")
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    delay = restart_delay(restarts_done)
    return RestartDecision(True, f"{how}; restart {restarts_done + 1} of {max_restarts} in {delay:g} s", delay)


def restart_delay(restarts_done: int, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """No wait for the first restart, then doubling from `base_s` up to `cap_s`."""
    return 0.0 if restarts_done == 0 else min(cap_s, base_s * 2 ** (restarts_done - 1))


@dataclass(frozen=True)
class ExitRecord:
    """A training process that ended for good (no restart follows)."""

    worker: str
    node: str
    returncode: int
    stderr_tail: str
    joined: bool  # it had registered with the coordinator


def never_joined_verdict(
    expected_per_node: Mapping[str, int], exits: list[ExitRecord], registered_alive: int
) -> str | None:
    """The reason to fail a job none of whose training processes ever joined it (a wrong path, a script
    that does not use ElasticJob, an import error), once every node's processes have ended for good."""
    if registered_alive or not expected_per_node or any(e.joined for e in exits):
        return None
    ended = {node: sum(1 for e in exits if e.node == node) for node in expected_per_node}
    if any(ended[node] < n for node, n in expected_per_node.items()):
        return None
    first = exits[0]
    how = f"was killed by signal {-first.returncode}" if first.returncode < 0 else f"exited with {first.returncode}"
    hint = " (does it use slurm_elastic.ElasticJob?)" if first.returncode == 0 else ""
    tail = " ".join(first.stderr_tail.split())[-300:]
    return f"the training command {how} on {first.node} without joining the job{hint}" + (f": {tail}" if tail else "")


def record_failure(counts: Mapping[str, int], signature: str) -> dict[str, int]:
    return {**counts, signature: counts.get(signature, 0) + 1}


def identical_failure_verdict(counts: Mapping[str, int], max_identical: int) -> str | None:
    """The reason to stop the job, or None while every failure is still below the bound."""
    for signature, n in counts.items():
        if n >= max_identical:
            return f"the same failure happened {n} times (limit {max_identical}): {signature}"
    return None
