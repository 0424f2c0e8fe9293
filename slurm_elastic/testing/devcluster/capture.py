"""Capture literal Slurm outputs from the running local cluster, as fixtures for the Slurm text parsers.

    python -m slurm_elastic.testing.devcluster.capture OUT_DIR     # cluster up and idle (make cluster-up)

It submits a running 2-node job (a name with spaces, a work dir with spaces) and a pending 4-node job,
drains n4, sets n3 DOWN, shrinks and requeues the running job, and saves each command's output in OUT_DIR.
A Markdown table of the files and their commands goes to stdout (for the fixtures' README).
Error outputs are named without "scontrol"+"job": the parser tests pick a parser from the file name.
Everything it changes is undone at the end: jobs cancelled, nodes resumed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.errors import ElasticError
from slurm_elastic.testing.devcluster.cluster import LocalCluster
from slurm_elastic.waiting import wait_until

__all__ = ["capture"]


@dataclass(frozen=True)
class Row:
    file: str
    command: str
    exit_code: int
    note: str


class _Recorder:
    def __init__(self, cluster: LocalCluster, out: Path) -> None:
        self.cluster = cluster
        self.out = out
        self.rows: list[Row] = []

    def save(self, file: str, argv: list[str], note: str, *, shown: str = "", stderr: bool = False) -> str:
        """Run argv; write its stdout (plus stderr when `stderr`) to `file` verbatim."""
        result = self.cluster.slurm(*argv, check=False)
        text = result.stdout + (result.stderr if stderr else "")
        (self.out / file).write_text(text)
        streams = "stdout+stderr" if stderr else "stdout"
        self.rows.append(Row(file, shown or shlex.join(argv), result.returncode, f"{note} ({streams})"))
        return text

    def job_state(self, job_id: str) -> str:
        return self.cluster.slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()

    def wait_state(self, job_id: str, state: str, timeout_s: float = 60.0) -> None:
        what = f"job {job_id} to be {state} (see {self.cluster.layout.ctld_log})"
        wait_until(lambda: self.job_state(job_id) == state, timeout=timeout_s, what=what, poll=0.5)


def capture(cluster: LocalCluster, out: Path) -> list[Row]:
    """Run the scenario on `cluster` (up, nodes idle) and write the outputs into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rec = _Recorder(cluster, out)
    work = Path(tempfile.mkdtemp(prefix="slurm elastic capture "))
    jobs: list[str] = []
    try:
        rec.save("scontrol_version.txt", ["scontrol", "--version"], "version string")
        rec.save("sinfo_nodes_idle.txt", ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], "4 idle nodes, once per partition")
        rec.save(
            "sbatch_test_only.txt",
            ["sbatch", "--test-only", "-N2", "--wrap", "true"],
            "a job that would start now; the line is on stderr",
            stderr=True,
        )
        rec.save(
            "sbatch_test_only_error.txt",
            ["sbatch", "--test-only", "-N8", "--wrap", "true"],
            "more nodes than exist; exit 1",
            stderr=True,
        )
        running_argv = [
            "sbatch",
            "--parsable",
            "-N2",
            "--exclusive",
            "-p",
            "train",
            "--job-name=elastic train run",
            f"--chdir={work}",
            "--output=%x-%j.out",
            "--wrap",
            "sleep 600",
        ]
        running = rec.save("sbatch_parsable.txt", running_argv, "job id of the running 2-node job").strip()
        jobs.append(running.split(";")[0])
        rec.wait_state(jobs[0], "RUNNING")
        pending_argv = [
            "sbatch",
            "--parsable",
            "-N4",
            "--exclusive",
            "--job-name=waiting for nodes",
            f"--chdir={work}",
            "--wrap",
            "sleep 600",
        ]
        jobs.append(cluster.slurm(*pending_argv).stdout.strip().split(";")[0])
        rec.wait_state(jobs[1], "PENDING")
        time.sleep(3.0)  # let the scheduler give the pending job its Reason (Resources)
        run_id, pend_id = jobs
        rec.save(
            "scontrol_show_job_running.txt",
            ["scontrol", "show", "job", "-o", run_id],
            "RUNNING 2-node job; name and work dir contain spaces",
            shown="scontrol show job -o <running>",
        )
        rec.save(
            "scontrol_show_job_running_multiline.txt",
            ["scontrol", "show", "job", run_id],
            "the same job, multi-line form",
            shown="scontrol show job <running>",
        )
        rec.save(
            "scontrol_show_job_pending.txt",
            ["scontrol", "show", "job", "-o", pend_id],
            "PENDING 4-node job (Reason=Resources)",
            shown="scontrol show job -o <pending>",
        )
        rec.save("scontrol_show_job_all.txt", ["scontrol", "show", "job", "-o"], "both jobs, one line each")
        rec.save("squeue_json.txt", ["squeue", "--json"], "a running and a pending job (22.05: openapi v0.0.38)")
        rec.save(
            "squeue_format.txt",
            ["squeue", "-h", "-o", "%i|%j|%T|%r|%D|%N|%B"],
            "id, name, state, reason, node count, nodes, batch host",
        )
        rec.save("squeue_default.txt", ["squeue"], "default table (names truncated to 8 characters)")
        rec.save(
            "scontrol_json_unsupported.txt",
            ["scontrol", "show", "job", "--json"],
            "no --json on scontrol before 23.02; exit 1",
            stderr=True,
        )
        cluster.slurm("scontrol", "update", "NodeName=n4", "State=DRAIN", "Reason=maintenance: disk check")
        cluster.slurm("scontrol", "update", "NodeName=n3", "State=DOWN", "Reason=simulated failure")
        rec.save(
            "scontrol_show_node.txt",
            ["scontrol", "show", "node", "-o"],
            "n1-n2 ALLOCATED, n3 DOWN (reason), n4 DRAIN (reason)",
        )
        rec.save("scontrol_show_node_n4.txt", ["scontrol", "show", "node", "n4"], "one node, multi-line form")
        rec.save("sinfo_nodes.txt", ["sinfo", "-N", "-h", "-o", "%N|%T|%E"], "per node and partition: state, reason")
        rec.save("sinfo_nodes_partition.txt", ["sinfo", "-N", "-h", "-o", "%N|%T|%P|%E"], "the same with partition")
        rec.save("sinfo_json.txt", ["sinfo", "--json"], "nodes and partitions (22.05: openapi v0.0.38)")
        rec.save("sinfo_default.txt", ["sinfo"], "default summary table")
        rec.save("scontrol_show_partition.txt", ["scontrol", "show", "partition", "-o"], "train and infer")
        rec.save("scontrol_show_hostnames.txt", ["scontrol", "show", "hostnames", "n[1-2,4]"], "expand a hostlist")
        rec.save("scontrol_show_hostlist.txt", ["scontrol", "show", "hostlist", "n1,n2,n4"], "compress a hostlist")
        cluster.slurm("scontrol", "update", f"JobId={run_id}", "NumNodes=1")
        time.sleep(1.0)
        rec.save(
            "scontrol_show_job_resized.txt",
            ["scontrol", "show", "job", "-o", run_id],
            "the running job after `scontrol update JobId=<running> NumNodes=1`",
            shown="scontrol show job -o <running>",
        )
        cluster.slurm("scontrol", "requeue", run_id)
        time.sleep(2.0)
        rec.save(
            "scontrol_show_job_requeued.txt",
            ["scontrol", "show", "job", "-o", run_id],
            "after `scontrol requeue <running>`: PENDING, Reason=BeginTime, Restarts=1",
            shown="scontrol show job -o <running>",
        )
        rec.save(
            "error_invalid_job_id.txt",
            ["scontrol", "show", "job", "-o", "999999"],
            "a job id that does not exist; exit 1",
            stderr=True,
        )
        cluster.slurm("scancel", pend_id)
        time.sleep(1.0)
        rec.save(
            "sacct_unsupported.txt",
            ["sacct", "-j", run_id, "-P", "-n"],
            "no accounting storage on this cluster",
            shown="sacct -j <running> -P -n",
            stderr=True,
        )
    finally:
        for job_id in jobs:
            cluster.slurm("scancel", job_id, check=False)
        cluster.slurm("scontrol", "update", "NodeName=n3,n4", "State=RESUME", check=False)
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=60.0)
        shutil.rmtree(work, ignore_errors=True)
    return rec.rows


def table(rows: list[Row]) -> str:
    lines = ["| file | command | exit | what it shows |", "| --- | --- | --- | --- |"]
    for row in rows:
        command = row.command.replace("|", "\\|")
        lines.append(f"| `{row.file}` | `{command}` | {row.exit_code} | {row.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_elastic.testing.devcluster.capture", description=__doc__)
    parser.add_argument("out", type=Path, help="directory for the captured files")
    parser.add_argument("--dir", type=Path, default=None, help="cluster state directory")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir)
    try:
        if not cluster.is_up():
            raise ElasticError(f"the local cluster in {cluster.state_dir} is not running: run `make cluster-up`")
        cluster.wait_nodes(cluster.nodes, want_idle=True, timeout_s=60.0)
        print(table(capture(cluster, args.out)))
    except ElasticError as exc:
        print(f"capture: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
