"""Prolog (slurmd, as root, on every node of a new job with PrologFlags=Alloc): is this node healthy?

On a problem it drains the node (FAIL for a fatal one) with a reason that says what is wrong, and asks
the wrapper to fail, so Slurm does not start the job here and requeues it.
Turn it off with `prolog = false` in hooks.toml, or by removing `Prolog=` from slurm.conf.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from slurm_elastic.hooks import base
from slurm_elastic.hooks.checks import Problem, reason_for, run_checks, target_state
from slurm_elastic.hooks.hookenv import job_env
from slurm_elastic.hooks.hooklog import HookLog
from slurm_elastic.hooks.policy import node_update
from slurm_elastic.hooks.slurmq import HookSlurm
from slurm_elastic.slurm.errors import SlurmError, SlurmTimeout

HOOK = "prolog"


def run(environ: Mapping[str, str]) -> int:
    started = time.monotonic()
    env = job_env(environ, on_node=True)
    assert env.node is not None  # job_env(on_node=True) guarantees it
    r = base.start(HOOK, environ, job=env.job_id, node=env.node)
    if not r.settings.prolog:
        r.log.event("check", "disabled")
        return base.EX_OK
    slurm = HookSlurm(timeout_s=base.SLURM_TIMEOUT_S)
    notices: list[str] = []
    problems = run_checks(r.settings, env.node, base.spool_dir(r.settings, env.node, slurm.spool_dir, r.log), notices)
    for notice in notices:
        r.log.event("cache", "refused", error=notice)
    elapsed = int((time.monotonic() - started) * 1000)
    if not problems:
        r.log.event("check", "ok", duration_ms=elapsed)
        return base.EX_OK
    reason = reason_for(HOOK, problems)
    r.log.event("check", "unhealthy", state=target_state(problems), reason=reason, duration_ms=elapsed)
    _drain(env.node, problems, r.log, deadline=started + base.time_bound(environ) - base.EXIT_MARGIN_S)
    return base.EX_REFUSE


def _drain(node: str, problems: Sequence[Problem], log: HookLog, *, deadline: float) -> None:
    """Drain the node with a reason that says what is wrong. Slurm drains it anyway when the prolog fails,
    but says only "Prolog error": a slurmctld slow to answer (just restarted, busy) is asked again, each
    attempt bounded by what is left before the wrapper's own timeout."""
    while (left := deadline - time.monotonic()) > 0:
        slurm = HookSlurm(timeout_s=min(base.SLURM_TIMEOUT_S, left))
        try:
            update = node_update(HOOK, slurm.node(node), problems, resume_when_healthy=False)
            if update is not None:
                slurm.set_node_state(node, *update)
                log.event("set_state", "ok", state=update[0], reason=update[1])
            return
        except SlurmTimeout as exc:
            log.event("set_state", "retry", error=str(exc))
        except SlurmError as exc:
            log.event("set_state", "error", error=str(exc))
            return
    log.event("set_state", "error", error="slurmctld did not answer in time; Slurm drains the node itself")


if __name__ == "__main__":
    base.entry(HOOK, run)
