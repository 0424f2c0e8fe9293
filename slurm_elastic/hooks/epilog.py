"""Epilog (slurmd, as root, on each node a job releases: at its end, or at once on a shrink).

When the node leaves an elastic job that goes on (a shrink, a satellite preempted or cancelled), tell
the job's coordinator to evict the node now instead of waiting for its heartbeats to time out. Then
clean the node: kill what is left of the job here and remove its data cache directory.
Turn parts off with `epilog_notify = false` / `epilog_cleanup = false` in hooks.toml.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from slurm_elastic.hooks import base
from slurm_elastic.hooks.cleanup import find_leftovers, kill_leftovers, remove_job_cache
from slurm_elastic.hooks.hookenv import JobEnv, job_env
from slurm_elastic.hooks.notify import notify
from slurm_elastic.hooks.policy import epilog_notice
from slurm_elastic.hooks.settings import expand_node_path
from slurm_elastic.hooks.slurmq import HookSlurm
from slurm_elastic.slurm.errors import SlurmError

HOOK = "epilog"


def _notify(env: JobEnv, node: str, r: base.Run) -> None:
    started = time.monotonic()
    job = None
    try:
        job = HookSlurm(timeout_s=base.SLURM_TIMEOUT_S).job(env.job_id)
    except SlurmError as exc:
        r.log.event("query", "error", error=str(exc))
    # The live comment first: the launcher sets it after the job starts, and the environment may hold
    # the one from submission (newer releases take it from the launch credential).
    comment = job.comment if job is not None and job.comment else env.comment
    handle = base.find_coordinator(comment, env.uid, r.log)
    if handle is None:
        return
    notice = epilog_notice(env.job_id, node, job, handle.job_id)
    if not notice.send:
        r.log.event("notify", "skip", why=notice.why)
        return
    sent = notify(handle, notice.nodes, notice.mode, notice.why, "epilog", timeout_s=r.settings.notify_timeout_s)
    r.log.event(
        "notify",
        sent.result,
        coordinator_job=handle.job_id,
        mode=notice.mode,
        why=notice.why,
        detail=None if sent.ok else sent.detail,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _cleanup(env: JobEnv, node: str, r: base.Run) -> None:
    started = time.monotonic()
    pids = find_leftovers(env.job_id, node, env.uid)
    alive = kill_leftovers(pids, env.job_id, node, env.uid) if pids else []
    cache = remove_job_cache(expand_node_path(r.settings.cache_dir, node), env.job_id, env.uid)
    r.log.event(
        "cleanup",
        "ok" if not alive and not cache.startswith("refused") else "partial",
        killed=len(pids) - len(alive),
        alive=",".join(map(str, alive)) or None,
        cache=cache,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def run(environ: Mapping[str, str]) -> int:
    env = job_env(environ, on_node=True)
    assert env.node is not None
    r = base.start(HOOK, environ, job=env.job_id, node=env.node)
    if r.settings.epilog_notify:
        _notify(env, env.node, r)
    if r.settings.epilog_cleanup:
        _cleanup(env, env.node, r)
    return base.EX_OK


if __name__ == "__main__":
    base.entry(HOOK, run)
