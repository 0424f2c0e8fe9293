"""HealthCheckProgram (slurmd, as root, every HealthCheckInterval on every node).

Each run reads this node's state from Slurm. While it is DRAIN or FAIL (set by an admin with scontrol,
or by this program), every elastic job running here is told once: FAIL -> leave now, DRAIN -> leave at
the next step boundary. That is how `scontrol update NodeName=n3 State=DRAIN` reaches a job within about
one interval. Every `full_check_interval_s` it also runs the node checks, and drains (or fails) the
node on a problem, or lifts its own drain once the node is healthy again.
Turn parts off with `healthcheck_checks = false` / `healthcheck_notify = false` in hooks.toml.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from slurm_elastic.hooks import base
from slurm_elastic.hooks.checks import run_checks
from slurm_elastic.hooks.dedupe import NodeState, RunState, StateFile, after_notify, mode_for, plan
from slurm_elastic.hooks.hookenv import this_node
from slurm_elastic.hooks.hooklog import HookLog
from slurm_elastic.hooks.notify import notify
from slurm_elastic.hooks.policy import node_event, node_update
from slurm_elastic.hooks.slurmq import HookSlurm
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.records import NodeInfo

HOOK = "healthcheck"
# A run that finds the previous one still going this long after it meant to be done logs it as busy.
BUSY_GRACE_S = 1.0


def _checks(node: str, info: NodeInfo | None, slurm: HookSlurm, r: base.Run) -> NodeInfo | None:
    """Run the node checks and set the node's state; returns the node as it is now."""
    started = time.monotonic()
    notices: list[str] = []
    problems = run_checks(r.settings, node, base.spool_dir(r.settings, node, slurm.spool_dir, r.log), notices)
    for notice in notices:
        r.log.event("cache", "refused", error=notice)
    update = node_update(HOOK, info, problems, r.settings.resume_when_healthy)
    elapsed = int((time.monotonic() - started) * 1000)
    if problems:
        details = "; ".join(f"{p.check}: {p.detail}" for p in problems)
        r.log.event("check", "unhealthy", problems=details, duration_ms=elapsed)
    if update is None:
        return info
    try:
        slurm.set_node_state(node, *update)
    except SlurmError as exc:
        r.log.event("set_state", "error", state=update[0], error=str(exc))
        return info
    r.log.event("set_state", "ok", state=update[0], reason=update[1] or None)
    try:
        return slurm.node(node)
    except SlurmError as exc:  # the update stands; the jobs hear of it from the next run's query
        r.log.event("query", "error", error=str(exc))
        return info


def _tell(job: str, uid: int, node: str, info: NodeInfo, state: NodeState, slurm: HookSlurm, r: base.Run) -> bool:
    """Tell job `job` that this node is DRAIN/FAIL; True when no later run needs to try again."""
    started = time.monotonic()
    log = HookLog(HOOK, job=job, node=node, log_dir=r.settings.log_dir, use_syslog=r.settings.syslog)
    try:
        found = slurm.job(job)
    except SlurmError as exc:
        log.event("query", "error", error=str(exc))
        return False
    if found is None:
        log.event("find", "gone")
        return True
    handle = base.find_coordinator(found.comment, uid, log)
    if handle is None:
        return True  # not elastic, or a handle that will not become valid: logged once
    mode = mode_for(state)
    why = f"Slurm marks {node} {state}" + (f": {info.reason}" if info.reason else "")
    sent = notify(handle, [node], mode, why, "healthcheck", timeout_s=r.settings.notify_timeout_s)
    log.event(
        "notify",
        sent.result,
        coordinator_job=handle.job_id,
        mode=mode,
        why=why,
        detail=None if sent.ok else sent.detail,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    return sent.result in ("ok", "refused")


def _notify(node: str, info: NodeInfo | None, slurm: HookSlurm, state: RunState, r: base.Run) -> RunState:
    event = node_event(info)
    jobs = slurm.running_jobs_on(node) if event is not None else []
    todo = plan(event, [job for job, _ in jobs], state.records)
    records = todo.records
    if event is None or info is None or not todo.to_notify:
        return replace(state, records=records)
    uids = dict(jobs)
    with ThreadPoolExecutor(max_workers=min(8, len(todo.to_notify))) as pool:
        futures = {job: pool.submit(_tell, job, uids[job], node, info, event, slurm, r) for job, _ in todo.to_notify}
    for job, future in futures.items():
        records = after_notify(records, job, event, future.result())
    return replace(state, records=records)


def _watch(
    node: str, seen: NodeState | None, slurm: HookSlurm, state: RunState, files: StateFile, r: base.Run, deadline: float
) -> None:
    """Keep asking for the node's state until the deadline; tell the jobs as soon as it turns DRAIN/FAIL.

    Only a change of state costs more than the one node query: a node that stays drained is not asked
    for its jobs again (it takes no new ones) until the next run.
    """
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(r.settings.watch_every_s, left))
        try:
            info = slurm.node(node)
            event = node_event(info)
            if event != seen:
                seen = event
                state = _notify(node, info, slurm, state, r)
                files.save(state)
        except SlurmError:
            continue  # the next run logs what is wrong; here a line every tick would flood the log


def run(environ: Mapping[str, str]) -> int:
    started = time.monotonic()
    node = this_node(environ)
    r = base.start(HOOK, environ, job=None, node=node)
    files = StateFile(Path(r.settings.state_dir), node)
    watching = r.settings.healthcheck_notify and r.settings.watch_s > 0
    with files.locked(until=time.time() + (r.settings.watch_s if watching else 0.0)) as claim:
        if not claim.held:
            # Slurm may start a run while the previous one still watches (seen on 24.11 after a state change):
            # say so only when that one overran (a slow nvidia-smi, a slow coordinator).
            now = time.time()
            if claim.overran(now, BUSY_GRACE_S):
                r.log.event("run", "busy", late_s=round(now - claim.holder_until, 1))
            return base.EX_OK
        state = files.load()
        slurm = HookSlurm(timeout_s=base.SLURM_TIMEOUT_S)
        try:
            info = slurm.node(node)
        except SlurmError as exc:
            r.log.event("query", "error", error=str(exc))
            return base.EX_OK
        now = time.time()
        if r.settings.healthcheck_checks and not 0 <= now - state.last_full_check < r.settings.full_check_interval_s:
            info = _checks(node, info, slurm, r)
            state = replace(state, last_full_check=now)
        if r.settings.healthcheck_notify:
            try:
                state = _notify(node, info, slurm, state, r)
            except SlurmError as exc:
                r.log.event("query", "error", error=str(exc))
        files.save(state)
        if watching:
            _watch(node, node_event(info), slurm, state, files, r, started + r.settings.watch_s)
    return base.EX_OK


if __name__ == "__main__":
    base.entry(HOOK, run)
