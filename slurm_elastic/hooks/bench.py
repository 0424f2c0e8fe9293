"""`slurm-elastic bench notify`: how fast Slurm's node events reach an elastic job on the local cluster,
with the admin hooks installed and without them, in one invocation.

For each setting a 4-node core job trains (down to 1 node) while its nodes are drained one by one with
`scontrol update NodeName=.. State=DRAIN`; then fresh 4-node jobs are shrunk with `scontrol update
JobId=.. NumNodes=3`. A figure is the median over those events of the time from the scontrol command to
the coordinator's eviction of the node (its `membership_change`; a drain waits for a step boundary).
Without hooks a drain is seen by the launcher's own watch of node states (every node_watch_interval_s,
5 s by default), and a shrink by the loss of the killed agents' connections.
The cluster is restarted with and without the hooks, and left as it was found.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_elastic.commands.common import print_result
from slurm_elastic.errors import ElasticError
from slurm_elastic.events import EventsFile
from slurm_elastic.eventtypes import DrainRequested, MembershipChange, NodeLost, Progress
from slurm_elastic.hooks.install import MIN_INTERVAL_S, InstallOptions, install, watch_for
from slurm_elastic.jobdir import job_dir
from slurm_elastic.showcase.metrics import median
from slurm_elastic.showcase.workload import corpus, train_command
from slurm_elastic.slurm import CliBackend
from slurm_elastic.testing.devcluster import ClusterError, LocalCluster
from slurm_elastic.waiting import WaitTimedOut, wait_until

__all__ = ["add_parser", "hooks_dir_of", "restart_cluster", "run", "run_notify"]

CORE = Path(__file__).resolve().parents[2] / "sbatch_templates" / "elastic_core.sbatch"
Log = Callable[[str], None]


def hooks_dir_of(cluster: LocalCluster) -> Path | None:
    """The hooks directory a running cluster was started with (None: no hooks)."""
    conf = cluster.slurm_conf_path
    text = conf.read_text() if conf.is_file() else ""
    match = re.search(r"^(?:Prolog|Epilog|HealthCheckProgram)=(.+)/[^/]+$", text, re.MULTILINE)
    return Path(match.group(1)) if match else None


def restart_cluster(cluster: LocalCluster, hooks_dir: Path | None, attempts: int = 3) -> None:
    """`up` with (or without) hooks. Tried again because devcluster's start-up check can take a starting
    slurmctld for a dead one while it sets its process title (`up` then leaves the cluster down)."""
    for attempt in range(attempts):
        try:
            cluster.up(hooks_dir=hooks_dir)
            return
        except ClusterError:
            if attempt == attempts - 1:
                raise


class Job(EventsFile):
    """One core job, watched through its events file."""

    def __init__(self, root: Path, env: dict[str, str], job_id: str) -> None:
        super().__init__(
            job_dir(job_id, Path(env["SLURM_ELASTIC_HOME"])) / "events.jsonl", f"bench notify, job {job_id}"
        )
        self.root, self.env, self.job_id = root, env, job_id

    def settled(self, world: int) -> None:
        """`world` nodes train: a progress report after the last membership change."""
        self.wait(f"{world} nodes training", lambda: self.world() == world, timeout=180)
        since = self.of(MembershipChange)[-1].time
        self.wait("progress", lambda: any(e.time > since + 1 for e in self.of(Progress)), timeout=180)

    def eviction_after(self, t0: float, world: int) -> tuple[float, str]:
        """Seconds from t0 to the change to `world` nodes, and who told the coordinator first."""
        self.wait(f"the change to {world} nodes", lambda: self._change_after(t0, world) is not None, timeout=120)
        change = self._change_after(t0, world)
        assert change is not None
        told: list[DrainRequested | NodeLost] = [e for e in self.of(DrainRequested) if t0 < e.time <= change.time]
        told += [e for e in self.of(NodeLost) if t0 < e.time <= change.time]
        first = min(told, key=lambda e: e.time, default=None)
        source = "none" if first is None else first.source if isinstance(first, DrainRequested) else "connection lost"
        return round(change.time - t0, 3), source

    def _change_after(self, t0: float, world: int) -> MembershipChange | None:
        return next((e for e in self.of(MembershipChange) if e.time > t0 and e.world == world), None)


def _report_after(job: Job, t0: float, source: str, timeout: float = 15.0) -> float | None:
    def first() -> float | None:
        return min((e.time for e in job.of(DrainRequested) if e.time > t0 and e.source == source), default=None)

    try:
        told = wait_until(first, timeout=timeout, what=f"a drain request from the {source}")
    except WaitTimedOut:
        return None
    return round(told - t0, 3)


def _submit(root: Path) -> Job:
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SLURM_ELASTIC_HOME": str(root / "home"),
        "SLURM_ELASTIC_MIN_NODES": "1",
        "SLURM_ELASTIC_HEARTBEAT_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_PROGRESS_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_MAX_RESTARTS": "0",
        "SLURM_ELASTIC_REQUEUE": "false",  # scancel ends the job; it must not come back
        "OMP_NUM_THREADS": "1",
        "SE_PYTHON": sys.executable,
    }
    argv = ["sbatch", "--parsable", "--nodes=4", f"--chdir={root}", f"--output={root}/core-%j.out", str(CORE)]
    argv += train_command(corpus(), 1_000_000)
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=30).stdout
    return Job(root, env, out.strip().split(";")[0])


def _scontrol(*args: str) -> float:
    started = time.time()
    subprocess.run(["scontrol", "update", *args], check=True, capture_output=True, timeout=30)
    return started


def measure(cluster: LocalCluster, root: Path, events: int, hooked: bool, log: Log) -> dict[str, list[Any]]:
    backend = CliBackend(env=cluster.command_env())
    keys = ("drain", "drain_first", "shrink", "shrink_first", "shrink_epilog_report")
    out: dict[str, list[Any]] = {key: [] for key in keys}
    job = _submit(root / "drain")
    drained: list[str] = []
    try:
        job.settled(4)
        info = backend.job(job.job_id)
        for node in [n for n in reversed(info.nodes) if n != info.batch_host][:events]:
            world = job.world()
            drained.append(node)
            seconds, first = job.eviction_after(_scontrol(f"NodeName={node}", "State=DRAIN", "Reason=bench"), world - 1)
            out["drain"].append(seconds)
            out["drain_first"].append(first)
            log(f"  drain {node}: evicted after {seconds:.3f} s (told first by: {first})")
            job.settled(world - 1)
    finally:
        backend.cancel(job.job_id)
        if drained:
            subprocess.run(["scontrol", "update", f"NodeName={','.join(drained)}", "State=RESUME"], check=False)
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
    # Without an accounting database, 22.05 refuses a second resize of a job ("the DB index is being
    # set"): one shrink per job.
    for i in range(events):
        job = _submit(root / f"shrink-{i}")
        try:
            job.settled(4)
            t0 = _scontrol(f"JobId={job.job_id}", "NumNodes=3")
            seconds, first = job.eviction_after(t0, 3)
            out["shrink"].append(seconds)
            out["shrink_first"].append(first)
            report = _report_after(job, t0, "epilog") if hooked else None
            out["shrink_epilog_report"].append(report)
            log(f"  shrink {i + 1}/{events}: evicted after {seconds:.3f} s (told first by: {first}; epilog: {report})")
        finally:
            backend.cancel(job.job_id)
            cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
    return out


def _figures(samples: dict[str, list[Any]]) -> dict[str, Any]:
    reports = [r for r in samples["shrink_epilog_report"] if r is not None]
    return {
        "drain_to_evict_s": median(samples["drain"]),
        "shrink_to_evict_s": median(samples["shrink"]),
        # A shrink SIGKILLs the node's agent: the coordinator usually sees its connection drop first,
        # and the Epilog's report (for a node whose connection does not drop) comes after.
        "shrink_to_epilog_report_s": median(reports) if reports else None,
    }


def run(*, events: int, log: Log) -> dict[str, Any]:
    if not 1 <= events <= 3:
        raise ElasticError(f"--events {events}: the 4-node local cluster gives 1 to 3 events of each kind")
    cluster = LocalCluster()
    if not cluster.is_up():
        raise ElasticError(f"the local Slurm cluster ({cluster.state_dir}) is not running: `make cluster-up` first")
    os.environ.update(cluster.env())
    found = hooks_dir_of(cluster)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-bench-notify-") as tmp:
        prefix = Path(tmp) / "hooks"
        opts = InstallOptions(
            prefix=prefix,
            python=Path(sys.executable),
            slurm_conf=cluster.slurm_conf_path,
            state_dir=Path(tmp) / "state",  # nothing left behind in /run or /dev/shm
            cache_dir=f"{tmp}/cache/%n",
        )
        install(opts)
        try:
            log(f"bench notify: with hooks ({prefix})")
            restart_cluster(cluster, prefix)
            hooked = measure(cluster, Path(tmp) / "with", events, True, log)
            log("bench notify: without hooks")
            restart_cluster(cluster, None)
            bare = measure(cluster, Path(tmp) / "without", events, False, log)
        finally:
            restart_cluster(cluster, found)
    return {
        **_figures(hooked),
        "without_hooks": _figures(bare),
        "target_s": 1.0,
        "events": events,
        "samples": {"with_hooks": hooked, "without_hooks": bare},
        "healthcheck_interval_s": MIN_INTERVAL_S,
        "watch_s": watch_for(opts),
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def add_parser(which: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `notify` to the `bench` subcommands."""
    p = which.add_parser("notify", help="node event -> eviction latency, with and without the admin hooks")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--events", type=int, default=3, help="drains and shrinks to measure, each (1-3)")
    p.set_defaults(func=run_notify)


def run_notify(args: argparse.Namespace) -> int:
    result = run(events=args.events, log=lambda line: print(line, file=sys.stderr, flush=True))
    print_result(result, args.json)
    return 0
