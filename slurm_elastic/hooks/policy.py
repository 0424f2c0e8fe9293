"""The hooks' decisions, as pure functions of what Slurm reports: whom to tell what, and which node
state to set. The entry points (prolog, epilog, healthcheck, epilog_slurmctld) only gather and act.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from slurm_elastic.hooks.checks import Problem, reason_for, target_state
from slurm_elastic.hooks.dedupe import NodeState
from slurm_elastic.slurm.records import JobInfo, NodeInfo

__all__ = ["HOOK_REASON_PREFIX", "Notice", "epilog_notice", "node_event", "node_update", "slurmctld_notice"]

# Every node Reason a hook sets starts with this; only such drains are lifted when the node is healthy again.
HOOK_REASON_PREFIX = "slurm-elastic "


@dataclass(frozen=True)
class Notice:
    """Tell the coordinator (`send`) that `nodes` leave the job, with `mode`; `why` is logged either way."""

    send: bool
    nodes: tuple[str, ...]
    mode: Literal["boundary", "now"]
    why: str


def epilog_notice(job_id: str, node: str, job: JobInfo | None, handle_job_id: str) -> Notice:
    """The Epilog on `node` for Slurm job `job_id`, whose comment names the coordinator of `handle_job_id`.

    A node leaves an elastic job that goes on when the job still runs without it (a shrink, or Slurm
    removed the node), or when the job is a satellite of another job's coordinator (a satellite ends:
    preempted, cancelled, its node failed). When the core job itself ends, its coordinator ends with it.
    """
    satellite = handle_job_id != job_id
    if job is not None and job.is_running and node not in job.nodes:
        return Notice(True, (node,), "now", f"{node} left running job {job_id} (now on {len(job.nodes)} nodes)")
    if satellite:
        state = job.state if job is not None else "gone"
        return Notice(True, (node,), "now", f"satellite job {job_id} of job {handle_job_id} ended ({state})")
    state = job.state if job is not None else "gone"
    return Notice(False, (node,), "now", f"job {job_id} itself ends ({state}): nothing to tell")


def slurmctld_notice(job_id: str, nodes: Sequence[str], handle_job_id: str) -> Notice:
    """EpilogSlurmctld: a satellite's end takes all its nodes out of the core job, even dead ones."""
    if handle_job_id != job_id and nodes:
        return Notice(True, tuple(nodes), "now", f"satellite job {job_id} of job {handle_job_id} ended")
    return Notice(False, tuple(nodes), "now", f"job {job_id} itself ends: nothing to tell")


def node_event(node: NodeInfo | None) -> NodeState | None:
    """FAIL (expected to fail: leave now) wins over DRAIN (leave at a boundary); anything else: None."""
    if node is None:
        return None
    if "FAIL" in node.flags or node.state == "FAIL":
        return "FAIL"
    if "DRAIN" in node.flags:
        return "DRAIN"
    return None


def node_update(
    hook: str, node: NodeInfo | None, problems: Sequence[Problem], resume_when_healthy: bool
) -> tuple[str, str] | None:
    """(State, Reason) to set on the node, or None to leave it as it is.

    Never downgrades (a FAILing node is not set to DRAIN), never repeats a state the node already has,
    and lifts only a drain that a slurm-elastic hook set itself.
    """
    current = node_event(node)
    wanted = target_state(problems)
    if wanted is None:
        ours = node is not None and node.reason.startswith(HOOK_REASON_PREFIX)
        if resume_when_healthy and current is not None and ours:
            return ("RESUME", "")
        return None
    if current == wanted or current == "FAIL":
        return None
    return (wanted, reason_for(hook, problems))
