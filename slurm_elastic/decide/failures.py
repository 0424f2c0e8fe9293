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
    """A training process that ended before the job ran."""

    worker: str
    node: str
    returncode: int
    stderr_tail: str
    joined: bool  # it had registered with the coordinator
    final: bool = True  # no restart follows


def never_joined_verdict(
    expected_per_node: Mapping[str, int], exits: list[ExitRecord], registered_alive: int
) -> str | None:
    """The reason to fail a job none of whose training processes ever joined it (a wrong path, a typo in the
    script's arguments, a script that does not use ElasticJob, an import error): at once where every process
    of every node failed alike in its first start, saying the same last words (a restart would fail the same
    way), else once every node's processes have ended for good."""
    if registered_alive or not expected_per_node or any(e.joined for e in exits):
        return None
    first: dict[str, ExitRecord] = {}  # by process slot (node:local rank), its first failure
    for e in exits:
        if e.returncode != 0:
            first.setdefault(e.worker.rsplit(":", 1)[0], e)
    failed = {node: sum(1 for e in first.values() if e.node == node) for node in expected_per_node}
    alike = {_alike(e) for e in first.values()}
    if all(failed[node] >= n for node, n in expected_per_node.items()) and len(alike) == 1 and alike.pop()[1]:
        e = next(iter(first.values()))
        return _never_joined(e, "on every node" if len(expected_per_node) > 1 else f"on {e.node}")
    final = [e for e in exits if e.final]
    ended = {node: sum(1 for e in final if e.node == node) for node in expected_per_node}
    if any(ended[node] < n for node, n in expected_per_node.items()):
        return None
    return _never_joined(final[0], f"on {final[0].node}")


def _alike(e: ExitRecord) -> tuple[int, str]:
    return e.returncode, last_line(e.stderr_tail)


def _never_joined(e: ExitRecord, where: str) -> str:
    how = f"was killed by signal {-e.returncode}" if e.returncode < 0 else f"exited with {e.returncode}"
    hint = " (does it use slurm_elastic.ElasticJob?)" if e.returncode == 0 else ""
    tail = last_line(e.stderr_tail)
    return f"the training command {how} {where} without joining the job{hint}" + (f": {tail}" if tail else "")


def last_line(text: str, limit: int = 300) -> str:
    """The last non-blank line of a process's output (an exception's own line), whitespace collapsed."""
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[-1].split())[-limit:] if lines else ""


def record_failure(counts: Mapping[str, int], signature: str) -> dict[str, int]:
    return {**counts, signature: counts.get(signature, 0) + 1}


def identical_failure_verdict(counts: Mapping[str, int], max_identical: int) -> str | None:
    """The reason to stop the job, or None while every failure is still below the bound."""
    for signature, n in counts.items():
        if n >= max_identical:
            return f"the same failure happened {n} times (limit {max_identical}): {signature}"
    return None
