"""Growing and shrinking a local job from outside it, as `grow` and `reclaim` do on Slurm.

A local job (`slurm-elastic run --local`) writes `launch.json` (launcher "local") next to its
`coordinator.json`. `grow --job ID --nodes K` then starts K more agents, each a process group of its own
(a simulated node), with `slurm-elastic agent --join ID`: the agent reads the address, the secret and the
training command from the job's directory, as a Slurm satellite does, so nothing is copied by hand. The
new nodes join at the next step boundary. `reclaim` drains nodes (the newest first) at a step boundary;
their agents then exit by themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.agentspec import AgentLaunch
from slurm_elastic.errors import ElasticError
from slurm_elastic.eventtypes import EventFormatError, NodeRegistered, of_kind
from slurm_elastic.jobdir import LaunchInfo, home_of
from slurm_elastic.waiting import wait_until

_LOCAL = re.compile(r"^local(\d+)$")


def registered_nodes(job_dir: Path) -> list[str]:
    """Every node that ever registered with the job, oldest first (from its events.jsonl)."""
    names: list[str] = []
    path = job_dir / "events.jsonl"
    if not path.is_file():  # absent, or not a regular file (a test points it at /dev/full)
        return names
    with contextlib.suppress(OSError), open(path, errors="replace") as fh:
        for line in fh:
            if f'"{NodeRegistered.KIND}"' not in line:
                continue
            try:
                found = of_kind([json.loads(line)], NodeRegistered)
            except (ValueError, EventFormatError):  # a line being written
                continue
            names += [e.node for e in found if e.node not in names]
    return names


def next_node_names(used: Iterable[str], count: int) -> list[str]:
    """`count` names local<N> above every local<N> used so far (a name is never reused: worker ids, ledger
    files and events name it)."""
    numbers = [int(m.group(1)) for name in used if (m := _LOCAL.match(name))]
    first = max(numbers, default=0) + 1
    return [f"local{first + i}" for i in range(count)]


def choose_local_nodes_to_reclaim(nodes: list[str], registered: list[str], count: int, job_id: str) -> list[str]:
    """The newest nodes first (the highest local<N>: those grown last), then the last registered; at least
    one node stays."""
    if count >= len(nodes):
        raise ElasticError(f"job {job_id} has {len(nodes)} node(s): at most {len(nodes) - 1} can be given back")
    order = {name: i for i, name in enumerate(registered)}

    def newest(name: str) -> tuple[int, int]:
        m = _LOCAL.match(name)
        return (int(m.group(1)) if m else -1, order.get(name, -1))

    return sorted(nodes, key=newest, reverse=True)[:count]


@dataclass(frozen=True)
class LocalNode:
    name: str
    pid: int
    log: Path


def is_local_job(job_dir: Path) -> bool:
    try:
        return LaunchInfo.read(job_dir).launcher == "local"
    except ElasticError:  # no launch.json: a job started before it existed, or not a local one
        return False


def start_local_agents(job_id: str, job_dir: Path, count: int) -> list[LocalNode]:
    """Start `count` agents that join the running local job `job_id`; returns them once started."""
    info = LaunchInfo.read(job_dir)
    names = next_node_names(registered_nodes(job_dir), count)
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "SLURM_ELASTIC_SECRET")}
    env["SLURM_ELASTIC_HOME"] = str(home_of(job_dir))  # where the agent finds the job again
    logs = job_dir / "nodes"
    logs.mkdir(parents=True, exist_ok=True)
    started = []
    for name in names:
        log = logs / f"{name}.log"
        argv = AgentLaunch(join=job_id, node=name).to_argv()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, env=env, cwd=info.cwd, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
            )
        started.append(LocalNode(name, proc.pid, log))
    return started


def wait_registered(
    nodes: list[LocalNode], registered: Callable[[], list[str]], timeout: float, poll: float = 0.2
) -> None:
    """Return once every node's agent registered; an agent that exits first or a timeout is an error."""

    def waiting() -> list[LocalNode]:
        known = set(registered())
        return [n for n in nodes if n.name not in known]

    def exited() -> str | None:
        for node in waiting():
            if not _alive(node.pid):
                tail = node.log.read_text(errors="replace").strip().splitlines()[-1:] if node.log.exists() else []
                return f"the agent of {node.name} exited before joining: {' '.join(tail) or node.log}"
        return None

    what = f"{[n.name for n in nodes]} to register (see {nodes[0].log})"
    wait_until(lambda: not waiting(), timeout=timeout, what=what, poll=poll, give_up=exited)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it if it ended
        return done == 0
    except ChildProcessError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
