"""`slurm-elastic bench mttr --slurm`: recovery from a node failure on the local Slurm cluster, elastic
versus the usual Slurm practice (the job is requeued, restarts, and resumes from its latest checkpoint).

Both run the same workload through `elastic_core.sbatch` on 4 nodes. A failure is `kill_node`: the node's
slurmd, step daemons and tasks die at once. Elastic: the survivors go on; the node is restarted and the
job starts an agent there again before the next kill. Baseline: the job is requeued as soon as the failure
is seen (kinder than waiting for Slurm's SlurmdTimeout), restarts once Slurm allows, loads the checkpoint
written every `checkpoint_every` steps and replays what was lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ElasticError
from slurm_elastic.events import EventsFile
from slurm_elastic.eventtypes import Commit
from slurm_elastic.jobdir import job_dir, user_name
from slurm_elastic.launch.slurm import satellites_of
from slurm_elastic.showcase.metrics import median, recovery_after
from slurm_elastic.showcase.workload import corpus, example
from slurm_elastic.slurm import CliBackend
from slurm_elastic.testing.devcluster import LocalCluster

CORE = Path(__file__).resolve().parents[3] / "sbatch_templates" / "elastic_core.sbatch"


class Run(EventsFile):
    """One core job on the local cluster, watched through its events file."""

    def __init__(self, root: Path, env: dict[str, str], job_id: str) -> None:
        super().__init__(job_dir(job_id, Path(env["SLURM_ELASTIC_HOME"])) / "events.jsonl", f"bench job {job_id}")
        self.root, self.env, self.job_id = root, env, job_id

    def commits(self) -> list[Commit]:
        return self.of(Commit)


def _submit(root: Path, mode: str, checkpoint_every: int) -> Run:
    env = {
        **os.environ,
        "SLURM_ELASTIC_HOME": str(root / "home"),
        "SLURM_ELASTIC_RECOVERY": mode,
        "SLURM_ELASTIC_RECORD_COMMITS": "true",
        "SLURM_ELASTIC_CHECKPOINT_EVERY": str(checkpoint_every),
        "SLURM_ELASTIC_HEARTBEAT_INTERVAL_S": "0.5",
        "SLURM_ELASTIC_MAX_RESTARTS": "0",
        "SLURM_ELASTIC_NODE_WATCH_INTERVAL_S": "1",
        "OMP_NUM_THREADS": "1",
        "SE_PYTHON": sys.executable,
    }
    root.mkdir(parents=True, exist_ok=True)
    train = [sys.executable, str(example()), "--data", str(corpus()), "--steps", "1000000"]
    argv = ["sbatch", "--parsable", "--nodes=3-4", f"--chdir={root}", f"--output={root}/core-%j.out", str(CORE), *train]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=30).stdout
    return Run(root, env, out.strip().split(";")[0])


def measure(mode: str, kills: int, cluster: LocalCluster, root: Path, log: Callable[[str], None]) -> dict[str, Any]:
    backend = CliBackend(env=cluster.command_env())
    # A node still completing the previous job would make Slurm start this one on fewer nodes: wait for all.
    cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
    run = _submit(root, mode, checkpoint_every=10)
    killed: list[float] = []
    try:
        run.wait("the job to train on 4 nodes", lambda: run.world() == 4 and len(run.commits()) >= 15)
        for i in range(kills):
            batch_host = backend.job(run.job_id).batch_host
            victim = [n for n in backend.job(run.job_id).nodes if n != batch_host][-1]
            last = max(c.step for c in run.commits())
            run.wait("a fresh commit", lambda last=last: max(c.step for c in run.commits()) > last)  # type: ignore[misc]
            when = time.time()
            cluster.kill_node(victim)
            killed.append(when)
            run.wait("recovery", lambda when=when: recovery_after(when, run.commits()).mttr_s is not None)  # type: ignore[misc]
            cluster.restart_node(victim)  # the node comes back: the elastic job starts an agent there again
            if mode == "in_process":
                run.wait("4 nodes again", lambda: run.world() == 4, timeout=300)
            goal = max(c.step for c in run.commits()) + 10
            run.wait("steps after recovery", lambda goal=goal: max(c.step for c in run.commits()) >= goal)  # type: ignore[misc]
            # Only now is it known which commit after the kill lasted (a requeued job replays).
            log(f"  {mode}: kill {i + 1}/{kills} of {victim}: {recovery_after(when, run.commits()).mttr_s:.2f} s")
    finally:
        subprocess.run(["scancel", run.job_id], env=run.env, check=False, timeout=30)
        for job in satellites_of(backend, run.job_id, user_name()):
            backend.cancel(job.job_id)
    recoveries = [recovery_after(t, run.commits()) for t in killed]
    return {"mttr_s": [r.mttr_s for r in recoveries], "lost": [r.lost_steps for r in recoveries]}


def run(*, nodes: int, kills: int, log: Callable[[str], None]) -> dict[str, Any]:
    if nodes != 4:
        raise ElasticError("bench mttr --slurm uses the local cluster's 4 nodes (--nodes 4)")
    cluster = LocalCluster()
    if not cluster.is_up():
        raise ElasticError(f"the local Slurm cluster ({cluster.state_dir}) is not running: `make cluster-up` first")
    os.environ.update(cluster.env())
    started = time.monotonic()
    # A killed node's job steps may still be writing into the directory when it is removed: that must not
    # cost the figures measured.
    with tempfile.TemporaryDirectory(prefix="slurm-elastic-bench-slurm-", ignore_cleanup_errors=True) as tmp:
        log(f"bench mttr --slurm: {kills} node failures, elastic recovery")
        elastic = measure("in_process", kills, cluster, Path(tmp) / "elastic", log)
        log(f"bench mttr --slurm: {kills} node failures, requeue and resume from a checkpoint (every 10 steps)")
        baseline = measure("requeue", kills, cluster, Path(tmp) / "baseline", log)
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=120)  # its steps ended: little left writing
    e_med = median([m for m in elastic["mttr_s"] if m is not None])
    b_med = median([m for m in baseline["mttr_s"] if m is not None])
    return {
        "slurm": True,
        "nodes": nodes,
        "kills": kills,
        "workload": "examples/train_char_lm.py through elastic_core.sbatch",
        "checkpoint_every": 10,
        "elastic_mttr_s": [round(m, 3) if m is not None else None for m in elastic["mttr_s"]],
        "baseline_mttr_s": [round(m, 3) if m is not None else None for m in baseline["mttr_s"]],
        "elastic_mttr_s_median": round(e_med, 3) if e_med is not None else None,
        "baseline_mttr_s_median": round(b_med, 3) if b_med is not None else None,
        "ratio": round(e_med / b_med, 4) if e_med is not None and b_med else None,
        "lost_steps_elastic": sum(elastic["lost"]),
        "lost_steps_baseline": sum(baseline["lost"]),
        "lost_steps_elastic_per_kill": elastic["lost"],
        "lost_steps_baseline_per_kill": baseline["lost"],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
