"""EpilogSlurmctld (optional; slurmctld, on the controller, when a job ends).

The controller's view of a satellite's end: it tells the core job's coordinator about all of the
satellite's nodes at once, including a node that died and so runs no Epilog of its own. The comment
in slurmctld's environment is the live one. Turn it off with `epilog_slurmctld_notify = false`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from slurm_elastic.hooks import base
from slurm_elastic.hooks.hookenv import job_env
from slurm_elastic.hooks.notify import notify
from slurm_elastic.hooks.policy import slurmctld_notice

HOOK = "epilog_slurmctld"


def run(environ: Mapping[str, str]) -> int:
    started = time.monotonic()
    env = job_env(environ, on_node=False)
    r = base.start(HOOK, environ, job=env.job_id, node=None)
    if not r.settings.epilog_slurmctld_notify:
        r.log.event("notify", "disabled")
        return base.EX_OK
    handle = base.find_coordinator(env.comment, env.uid, r.log)
    if handle is None:
        return base.EX_OK
    notice = slurmctld_notice(env.job_id, env.nodes, handle.job_id)
    if not notice.send:
        r.log.event("notify", "skip", why=notice.why)
        return base.EX_OK
    sent = notify(
        handle, notice.nodes, notice.mode, notice.why, "epilog_slurmctld", timeout_s=r.settings.notify_timeout_s
    )
    r.log.event(
        "notify",
        sent.result,
        coordinator_job=handle.job_id,
        nodes=",".join(notice.nodes),
        mode=notice.mode,
        detail=None if sent.ok else sent.detail,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    return base.EX_OK


if __name__ == "__main__":
    base.entry(HOOK, run)
