"""Prolog (slurmd, as root, on every node of a new job with PrologFlags=Alloc): is this node healthy?

On a problem it drains the node (FAIL for a fatal one) with a reason that says what is wrong, and asks
the wrapper to fail, so Slurm does not start the job here and requeues it.
Turn it off with `prolog = false` in hooks.toml, or by removing `Prolog=` from slurm.conf.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from slurm_elastic.hooks import base
from slurm_elastic.hooks.checks import reason_for, run_checks, target_state
from slurm_elastic.hooks.hookenv import job_env
from slurm_elastic.hooks.policy import node_update
from slurm_elastic.hooks.slurmq import HookSlurm
from slurm_elastic.slurm.errors import SlurmError

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
    try:
        update = node_update(HOOK, slurm.node(env.node), problems, resume_when_healthy=False)
        if update is not None:
            slurm.set_node_state(env.node, *update)
            r.log.event("set_state", "ok", state=update[0], reason=update[1])
    except SlurmError as exc:
        # Slurm drains the node itself when the prolog fails, with a vaguer reason: refuse the job anyway.
        r.log.event("set_state", "error", error=str(exc))
    return base.EX_REFUSE


if __name__ == "__main__":
    base.entry(HOOK, run)
