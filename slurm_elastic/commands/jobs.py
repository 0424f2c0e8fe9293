"""Operator commands for a running job: `status`, `reclaim` (give nodes back) and `grow` (add satellites).

On a local job (`slurm-elastic run --local`) `grow` starts local agents that join it and `reclaim` drains
its newest nodes (`launch/localgrow.py`), so the same commands can be tried on one machine first."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from slurm_elastic.commands.common import fail
from slurm_elastic.errors import ElasticError, SlurmError
from slurm_elastic.eventtypes import summarize
from slurm_elastic.jobdir import JobHandle, find_job, job_dir
from slurm_elastic.sanitize import printable
from slurm_elastic.waiting import holds_within
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import request

USER_HELP = "the job's user, for root acting on another user's job (its files: $SLURM_ELASTIC_HOME/jobs/USER/)"


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="what a running job is doing")
    status.add_argument("--job", required=True, help="the job id (Slurm job id, or the local launcher's id)")
    status.add_argument("--json", action="store_true")
    status.add_argument("--user", default=None, help=USER_HELP)
    status.set_defaults(func=run_status)

    reclaim = sub.add_parser("reclaim", help="take K nodes back from a running job (Slurm or local) at a step boundary")
    reclaim.add_argument("--job", required=True)
    reclaim.add_argument("--nodes", type=int, required=True, metavar="K")
    reclaim.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    reclaim.add_argument("--user", default=None, help=USER_HELP)
    reclaim.set_defaults(func=run_reclaim)

    grow = sub.add_parser("grow", help="add K nodes to a running job: Slurm satellite jobs, or local agents")
    grow.add_argument("--job", required=True)
    grow.add_argument("--nodes", type=int, required=True, metavar="K")
    grow.add_argument("--partition", default=None)
    grow.add_argument("--keep-pending", action="store_true", help="keep K satellites queued for freed nodes")
    grow.add_argument("--timeout", type=float, default=120.0, help="local job: wait this long for the agents")
    grow.set_defaults(func=run_grow)


def _ask(handle: JobHandle, message: msg.KeepPending | msg.DrainRequest | msg.StatusRequest) -> msg.Message:
    try:
        return request(handle.address, message, secret=handle.secret, job_id=handle.job_id)
    except OSError as exc:
        raise ElasticError(f"job {handle.job_id}'s coordinator at {handle.address} does not answer: {exc}") from None


def status_of(handle: JobHandle) -> msg.StatusReply:
    reply = _ask(handle, msg.StatusRequest())
    if not isinstance(reply, msg.StatusReply):
        raise ElasticError(f"unexpected answer {reply.type!r} from job {handle.job_id}")
    return reply


def render_status(s: msg.StatusReply) -> str:
    """The status for a person. Its text comes from peers, workers and the user's code (worker ids, reasons,
    stderr tails): each line is made printable, so no control character of theirs reaches the terminal."""
    rate = f", {s.samples_per_s:.1f} samples/s" if s.samples_per_s else ""
    loss = f", loss {s.loss:.4f}" if s.loss is not None else ""
    lines = [f"job {s.job_id}: {s.state}, generation {s.generation}, world {s.world_size}, step {s.step}{loss}{rate}"]
    nodes = [f"{n} (slurm job {s.node_jobs.get(n)})" if s.node_jobs.get(n) else n for n in s.nodes]
    lines.append(f"nodes: {', '.join(nodes) or '-'}")
    interfaces = [f"{n} {s.node_interfaces[n]}" for n in s.nodes if s.node_interfaces.get(n)]
    if interfaces:
        lines.append(f"training groups' interface: {'; '.join(interfaces)}")
    lines.append("members:")
    for m in s.members:
        rank = f"rank {m.rank:<3}" if m.rank is not None else "held    " if m.worker_id in s.held else "joining "
        lines.append(f"  {rank} {m.worker_id:<24} step {m.step:<7} {m.phase:<10} seen {m.last_seen_s:.1f} s ago")
    if s.pending:
        lines.append(f"joining at the next step boundary: {', '.join(s.pending)}")
    if s.draining:
        lines.append(f"draining at the next step boundary: {', '.join(s.draining)}")
    if s.held:
        held = ", ".join(sorted(set(s.held.values())))
        lines.append(f"held out until they reach every member again: {held}")
    lines.append("last events:")
    for e in s.events[-10:]:
        when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        lines.append(printable(f"  {when} {e['event']} {summarize(e)}")[:160])
    return "\n".join(printable(line) for line in lines)


def status_json(s: msg.StatusReply) -> str:
    """The status for tools: every value as it is, in JSON whose every character outside printable ASCII is
    escaped (`\\u001b`), so printing it to a terminal is safe too. A number that is not finite (an overflowed
    float16 step's loss) is null: strict JSON has no Infinity or NaN."""
    return json.dumps(_finite(s.model_dump(mode="json")), separators=(",", ":")).replace("\x7f", "\\u007f")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def run_status(args: argparse.Namespace) -> int:
    reply = status_of(find_job(args.job, user=args.user))
    print(status_json(reply) if args.json else render_status(reply))
    return 0


def choose_nodes_to_reclaim(status: msg.StatusReply, core_job: str, batch_host: str | None, count: int) -> list[str]:
    """Satellites first (their jobs can simply end), then core nodes from the last; never the batch host."""
    candidates = [n for n in status.nodes if n != batch_host]
    satellites = [n for n in candidates if status.node_jobs.get(n) not in (None, core_job)]
    core = [n for n in reversed(candidates) if n not in satellites]
    chosen = (satellites + core)[:count]
    if len(chosen) < count:
        raise ElasticError(
            f"job {core_job} can give back at most {len(candidates)} nodes now (the batch host {batch_host} stays)"
        )
    return chosen


def _drain(handle: JobHandle, nodes: list[str], hold_s: float = 0.0) -> None:
    """Drain `nodes` at the next step boundary; with `hold_s`, their agents then wait for Slurm's shrink."""
    if nodes:
        print(f"reclaim: draining {', '.join(nodes)} from job {handle.job_id} at the next step boundary")
        reason = "reclaimed by an operator"
        _ask(handle, msg.DrainRequest(nodes=nodes, mode="boundary", reason=reason, source="reclaim", hold_s=hold_s))


def trains_on(status: msg.StatusReply, nodes: list[str]) -> bool:
    """Whether any of `nodes` still hosts a worker of the job, or a drain that has not happened yet."""
    return bool(set(nodes) & ({m.node for m in status.members} | set(status.draining)))


def _agents_gone(handle: JobHandle, nodes: list[str]) -> bool:
    try:
        return not set(nodes) & set(status_of(handle).nodes)
    except ElasticError:  # the job ended meanwhile, and its agents with it
        return True


def run_reclaim_local(args: argparse.Namespace, handle: JobHandle) -> int:
    from slurm_elastic.launch.localgrow import choose_local_nodes_to_reclaim, registered_nodes

    status = status_of(handle)
    registered = registered_nodes(job_dir(args.job, user=args.user))
    nodes = choose_local_nodes_to_reclaim(status.nodes, registered, args.nodes, args.job)
    _drain(handle, nodes)
    if not holds_within(lambda: _agents_gone(handle, nodes), timeout=args.timeout, poll=0.2):
        return fail(f"nodes {nodes} did not leave job {args.job} within {args.timeout:.0f} s", 1)
    print(f"reclaim: released {', '.join(nodes)} (their agents exit by themselves)")
    return 0


def run_reclaim(args: argparse.Namespace) -> int:
    from slurm_elastic.launch.localgrow import is_local_job
    from slurm_elastic.slurm import get_backend

    if args.nodes < 1:
        return fail(f"--nodes {args.nodes}: expected at least 1")
    handle = find_job(args.job, user=args.user)
    if is_local_job(job_dir(args.job, user=args.user)):
        return run_reclaim_local(args, handle)
    backend = get_backend()
    core = backend.job(args.job)
    status = status_of(handle)
    nodes = choose_nodes_to_reclaim(status, args.job, core.batch_host, args.nodes)
    deadline = time.monotonic() + args.timeout
    satellites = {status.node_jobs[n] for n in nodes if status.node_jobs.get(n) not in (None, args.job)}
    core_nodes = [n for n in nodes if status.node_jobs.get(n) in (None, args.job)]
    satellite_nodes = [n for n in nodes if n not in core_nodes]
    _drain(handle, satellite_nodes)  # a satellite's job ends with its agent, then it is cancelled
    _drain(handle, core_nodes, hold_s=min(args.timeout, 3600.0))  # the shrink should find their agents alive

    def left() -> bool:
        return not trains_on(status_of(handle), nodes) and _agents_gone(handle, satellite_nodes)

    if not holds_within(left, timeout=deadline - time.monotonic(), poll=0.2):
        return fail(f"nodes {nodes} did not leave job {args.job} within {args.timeout:.0f} s", 1)
    try:
        for job_id in sorted(s for s in satellites if s):
            backend.cancel(job_id)
        if core_nodes:
            keep = [n for n in backend.job(args.job).nodes if n not in core_nodes]
            backend.resize_job(args.job, nodelist=keep)

        def still_held() -> list[str]:
            held = set(backend.job(args.job).nodes) & set(core_nodes)
            return sorted(held) + [s for s in satellites if s and not backend.job(s).is_finished]

        if not holds_within(lambda: not still_held(), timeout=deadline - time.monotonic(), poll=0.5):
            return fail(f"Slurm did not release {still_held()} within {args.timeout:.0f} s", 1)
    except SlurmError as exc:
        return fail(f"the nodes left the training job, but Slurm did not release them: {exc}", 1)
    if not holds_within(lambda: _agents_gone(handle, nodes), timeout=deadline - time.monotonic(), poll=0.2):
        return fail(f"Slurm released {nodes}, but their agents did not end within {args.timeout:.0f} s", 1)
    print(f"reclaim: released {', '.join(nodes)}")
    return 0


def run_grow_local(args: argparse.Namespace, handle: JobHandle) -> int:
    from slurm_elastic.launch.localgrow import start_local_agents, wait_registered

    if args.keep_pending or args.partition:
        return fail("--keep-pending and --partition are Slurm settings; a local job grows with --nodes K only")
    started = start_local_agents(args.job, job_dir(args.job), args.nodes)
    wait_registered(started, lambda: status_of(handle).nodes, args.timeout)
    print(json.dumps({"job": args.job, "nodes": [n.name for n in started], "pids": [n.pid for n in started]}))
    print(f"grow: {len(started)} local node(s) registered; they join at the next step boundary", file=sys.stderr)
    return 0


def run_grow(args: argparse.Namespace) -> int:
    from slurm_elastic.launch.localgrow import is_local_job
    from slurm_elastic.launch.slurm import submit_satellite
    from slurm_elastic.slurm import get_backend

    if args.nodes < 1:
        return fail(f"--nodes {args.nodes}: expected at least 1")
    handle = find_job(args.job)
    if is_local_job(job_dir(args.job)):
        return run_grow_local(args, handle)
    if args.keep_pending:
        reply = _ask(handle, msg.KeepPending(count=args.nodes, partition=args.partition))
        print(
            f"grow: job {args.job} keeps {args.nodes} satellite(s) pending"
            + (f" ({reply.detail})" if isinstance(reply, msg.Ack) else "")
        )
        return 0
    backend = get_backend()
    ids = [submit_satellite(backend, args.job, args.partition) for _ in range(args.nodes)]
    print(json.dumps({"job": args.job, "satellites": ids}))
    return 0
