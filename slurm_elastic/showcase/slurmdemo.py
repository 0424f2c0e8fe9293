"""`slurm-elastic demo --slurm`: the demo through `elastic_core.sbatch` on the local Slurm cluster.

A core job trains on n1-n3; a satellite joins on n4; n2 dies (its slurmd, step daemons and tasks are
killed); an `infer` job preempts the satellite, which drains at a step boundary and requeues itself;
when the infer job ends the satellite rejoins. The result is compared with an uninterrupted run of the
same job, submitted the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.errors import ElasticError
from slurm_elastic.events import EventsFile
from slurm_elastic.eventtypes import Commit, MembershipChange
from slurm_elastic.jobdir import job_dir
from slurm_elastic.launch.slurm import submit_satellite
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.demo import render
from slurm_elastic.showcase.metrics import max_param_rel_diff, recovery_after, tolerance
from slurm_elastic.showcase.workload import corpus, train_command
from slurm_elastic.slurm import CliBackend
from slurm_elastic.testing.devcluster import LocalCluster

CORE = Path(__file__).resolve().parents[2] / "sbatch_templates" / "elastic_core.sbatch"
STEPS = 2400


class DemoJob(EventsFile):
    def __init__(self, root: Path, backend: CliBackend, nodes: str, reduce_dtype: str) -> None:
        self.root, self.backend = root, backend
        root.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "SLURM_ELASTIC_HOME": str(root / "home"),
            "SLURM_ELASTIC_LEDGER_DIR": str(root / "ledger"),
            "SLURM_ELASTIC_RECORD_COMMITS": "true",
            "SLURM_ELASTIC_HEARTBEAT_INTERVAL_S": "0.5",
            "SLURM_ELASTIC_MAX_RESTARTS": "0",
            "SLURM_ELASTIC_PROGRESS_INTERVAL_S": "5",
            "SLURM_ELASTIC_REDUCE_DTYPE": reduce_dtype,
            "OMP_NUM_THREADS": "1",
            "SE_PYTHON": sys.executable,
        }
        command = train_command(corpus(), STEPS, root / "model.pt")
        args = [f"--nodelist={nodes}", f"--nodes={len(backend.hostnames(nodes))}", f"--output={root}/core-%j.out"]
        self.job_id = backend.submit(CORE, args=args, env=self.env, script_args=command)
        super().__init__(job_dir(self.job_id, root / "home") / "events.jsonl", f"demo job {self.job_id}")

    def finished(self) -> bool:
        info = self.backend.job(self.job_id)
        return info.is_finished and info.state != "REQUEUED"


def run_slurm_demo(workdir: Path | None, log: Callable[[str], None], reduce_dtype: str) -> dict[str, Any]:
    cluster = LocalCluster()
    if not cluster.is_up():
        raise ElasticError(f"the local Slurm cluster ({cluster.state_dir}) is not running: `make cluster-up` first")
    os.environ.update(cluster.env())
    backend = CliBackend(env=cluster.command_env())
    started = time.monotonic()
    out = workdir or Path(tempfile.mkdtemp(prefix="slurm-elastic-demo-slurm-"))
    try:
        log(f"demo --slurm: reference run of {STEPS} steps on n[1-3], uninterrupted")
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)  # none still completing another job
        ref = DemoJob(out / "reference", backend, "n[1-3]", reduce_dtype)
        ref.wait("the reference run", ref.finished, timeout=900)
        log("demo --slurm: elastic run on n[1-3]; a satellite joins, n2 dies, the satellite is preempted and rejoins")
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=180)
        job = DemoJob(out / "elastic", backend, "n[1-3]", reduce_dtype)
        job.wait("the job to start", lambda: job.world() == 3)
        satellite = submit_satellite(backend, job.job_id, "train", env=job.env)
        job.wait("the satellite to join", lambda: job.world() == 4)
        job.wait("a few more steps", lambda: len(job.of(Commit)) >= 20)
        killed = time.time()
        cluster.kill_node("n2")
        job.wait("recovery from the node failure", lambda: job.world() == 3)
        cluster.restart_node("n2")
        infer = _sbatch(["--partition=infer", "--exclusive", "--nodelist=n4", "--output=/dev/null", "--wrap=sleep 15"])
        job.wait("the satellite to be preempted", lambda: job.world() == 2)
        job.wait("the satellite to rejoin", lambda: job.world() == 3, timeout=300)
        job.wait("the end of training", job.finished, timeout=900)
        backend.cancel(satellite)
        commits = job.of(Commit)
        ref_commits = ref.of(Commit)
        ledger = analyze(job.root / "ledger")
        changes = job.of(MembershipChange)
        recovery = recovery_after(killed, commits)
        summary = {
            "steps": ledger.committed_steps,
            "failures": 1,
            "joins": sum(len(e.joined) for e in changes if e.cause != "start"),
            "mttr_s": [round(recovery.mttr_s, 4) if recovery.mttr_s is not None else None],
            "lost_committed_steps": recovery.lost_steps,
            "duplicate_samples": ledger.duplicate_samples,
            "skipped_samples": ledger.skipped_samples,
            "final_loss": round(commits[-1].loss, 6),
            "reference_final_loss": round(ref_commits[-1].loss, 6),
            "max_param_rel_diff": max_param_rel_diff(
                torch.load(job.root / "model.pt"), torch.load(ref.root / "model.pt")
            ),
            "reduce_dtype": reduce_dtype,
            "tolerance": tolerance(reduce_dtype, STEPS),
            "world_sizes": [e.world for e in changes],
            "generations": len(changes),
            "events": sorted({e["event"] for e in job.events()} - {"commit", "progress"}),
            "slurm_jobs": {"core": job.job_id, "satellite": satellite, "infer": infer, "reference": ref.job_id},
            "reference_commits": len(ref_commits),
            "elapsed_s": round(time.monotonic() - started, 1),
            "workdir": str(out) if workdir else None,
        }
        return summary
    finally:
        if workdir is None:
            shutil.rmtree(out, ignore_errors=True)


def _sbatch(args: list[str]) -> str:
    done = subprocess.run(["sbatch", "--parsable", *args], check=True, capture_output=True, text=True, timeout=30)
    return done.stdout.strip().split(";")[0]


def main(as_json: bool, workdir: Path | None, reduce_dtype: str = "float32") -> int:
    summary = run_slurm_demo(workdir, lambda line: print(line, file=sys.stderr, flush=True), reduce_dtype)
    print(json.dumps(summary) if as_json else render(summary))
    return 0
