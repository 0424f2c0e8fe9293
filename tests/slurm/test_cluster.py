"""The local Slurm cluster does what the design relies on: 4 nodes, preemption, shrink, node failure.

Every test cancels the jobs it submitted (by job name) and waits for all nodes to be idle again.
Assertions follow the order of events, never wall-clock times.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_elastic import waiting
from slurm_elastic.testing.devcluster import LocalCluster, procs

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

# Preemption takes GraceTime (5 s) plus up to one 30 s slurmctld timer tick, then a 10 s requeue delay.
WAIT_S = 120.0


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    waiting.wait_until(predicate, timeout=timeout_s, what=what, poll=0.25)


class Jobs:
    """Submits jobs under one job name and cancels every one of them at the end of the test."""

    def __init__(self, cluster: LocalCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    def sbatch(self, *args: str, suffix: str = "") -> int:
        result = self.cluster.slurm("sbatch", "--parsable", f"--job-name={self.name}{suffix}", *args)
        return int(result.stdout.strip().split(";")[0])

    def field(self, job_id: int, key: str) -> str:
        text = self.cluster.slurm("scontrol", "show", "job", "-o", str(job_id)).stdout
        match = re.search(rf"(?:^|\s){key}=(\S*)", text)
        assert match, f"no {key}= in {text!r}"
        return match.group(1)

    def state(self, job_id: int) -> str:
        return self.field(job_id, "JobState")

    def ids(self) -> list[str]:
        out = self.cluster.slurm("squeue", "-h", "-o", "%i %j", timeout_s=15.0).stdout
        return [
            line.split()[0] for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith(self.name)
        ]

    def cancel_all(self, *, wait: bool = True) -> None:
        for job_id in self.ids():
            self.cluster.slurm("scancel", job_id, check=False)
        if wait:
            wait_until(lambda: not self.ids(), f"jobs named {self.name}* to leave the queue", 60.0)


@pytest.fixture
def jobs(slurm_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Jobs]:
    tracker = Jobs(slurm_cluster, f"pytest-{request.node.name}"[:40])
    try:
        yield tracker
    finally:
        tracker.cancel_all()
        slurm_cluster.wait_nodes(slurm_cluster.nodes, want_idle=True, timeout_s=60.0)


def step_procs(cluster: LocalCluster, job_id: int, step: str = "0") -> dict[str, dict[int, int]]:
    """The live processes of one step of a job, by node, as {pid: ppid}, found through their environment."""
    found: dict[str, dict[int, int]] = {}
    for proc in procs.list_procs():
        env = procs.read_environ(proc.pid)
        if (
            env.get("SLURM_JOB_ID") == str(job_id)
            and env.get("SLURM_STEP_ID") == step
            and env.get("SLURM_CONF") == str(cluster.slurm_conf_path)
            and procs.alive(proc.pid)
        ):
            found.setdefault(env.get("SLURMD_NODENAME", "?"), {})[proc.pid] = proc.ppid
    return found


def task_pids(cluster: LocalCluster, job_id: int) -> dict[str, set[int]]:
    """Of each node's step processes, those whose parent is not one of them: the tasks themselves."""
    return {
        node: {pid for pid, ppid in group.items() if ppid not in group}
        for node, group in step_procs(cluster, job_id).items()
    }


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# A task that appends 'up <node>' to a log once and 'TERM <node>' when signalled, then waits until killed.
TASK_SCRIPT = """#!/bin/bash
log="$1"
trap 'echo "TERM $SLURMD_NODENAME" >> "$log"; exit 143' TERM
echo "up $SLURMD_NODENAME" >> "$log"
sleep 1000 &
wait $!
status=$?
# Slurm signals every process of the step: the sleep may die of the SIGTERM before this shell runs its trap.
trap '' TERM
[ "$status" -eq 143 ] && echo "TERM $SLURMD_NODENAME" >> "$log"
exit "$status"
"""


def tasks_up(log: Path) -> set[str]:
    return {line.split()[1] for line in log_lines(log) if line.startswith("up ")}


def task_step(tmp_path: Path, log: Path) -> str:
    """A shell line that runs TASK_SCRIPT as a step with one task on every node of the job."""
    script = tmp_path / "task.sh"
    script.write_text(TASK_SCRIPT)
    return f"srun --no-kill --ntasks-per-node=1 bash {shlex.quote(str(script))} {shlex.quote(str(log))}"


def test_srun_runs_one_task_on_each_node(slurm_cluster: LocalCluster, jobs: Jobs) -> None:
    result = slurm_cluster.slurm(
        "srun",
        "-N4",
        "--ntasks-per-node=1",
        f"--job-name={jobs.name}",
        "printenv",
        "SLURMD_NODENAME",
        timeout_s=60.0,
    )
    assert sorted(result.stdout.split()) == ["n1", "n2", "n3", "n4"]


def test_infer_job_preempts_train_job_which_is_requeued(
    slurm_cluster: LocalCluster, jobs: Jobs, tmp_path: Path
) -> None:
    log = tmp_path / "events.log"
    train_script = tmp_path / "train.sh"
    q_log = shlex.quote(str(log))
    train_script.write_text(
        "#!/bin/bash\n"
        f"echo start restart=${{SLURM_RESTART_COUNT:-0}} >> {q_log}\n"
        f"{task_step(tmp_path, log)}\n"
        f"echo srun-exited >> {q_log}\n"
        # The batch shell is not signalled: it outlives the grace time, so the job is requeued, not completed.
        "sleep 600\n"
    )
    train = jobs.sbatch("-p", "train", "-N4", "--exclusive", f"--output={tmp_path}/train-%j.out", str(train_script))
    # 'up' is written after the trap is set: a task signalled before that would die without a word.
    wait_until(
        lambda: log_lines(log).count("start restart=0") == 1 and len(tasks_up(log)) == 4,
        "the train job's 4 tasks to be up",
    )
    assert jobs.state(train) == "RUNNING"

    infer = jobs.sbatch(
        "-p",
        "infer",
        "-N4",
        "--exclusive",
        f"--output={tmp_path}/infer-%j.out",
        f"--wrap=echo infer-start >> {q_log}; sleep 2; echo infer-end >> {q_log}",
        suffix="-infer",
    )
    train_states: list[str] = []

    def train_restarted() -> bool:
        state = jobs.state(train)
        if not train_states or train_states[-1] != state:
            train_states.append(state)
        return "start restart=1" in log_lines(log)

    wait_until(train_restarted, "the train job to be requeued and to start again")
    events = log_lines(log)
    # The steps got SIGTERM on all 4 nodes, the infer job ran only after that, and the train job ran
    # again (SLURM_RESTART_COUNT=1) only after the infer job had ended.
    terms = [i for i, line in enumerate(events) if line.startswith("TERM ")]
    assert sorted(events[i].split()[1] for i in terms) == ["n1", "n2", "n3", "n4"], events
    assert max(terms) < events.index("infer-start") < events.index("infer-end") < events.index("start restart=1")
    assert events.index("srun-exited") < events.index("infer-start")
    assert jobs.field(train, "Restarts") == "1"
    assert jobs.state(infer) == "COMPLETED"
    # Seen between: RUNNING, then PENDING (requeued, waiting for BeginTime or nodes), then RUNNING again.
    assert train_states[0] == "RUNNING" and "PENDING" in train_states
    wait_until(lambda: jobs.state(train) == "RUNNING", "the requeued train job to run")


def test_scontrol_shrinks_a_running_job(slurm_cluster: LocalCluster, jobs: Jobs, tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    job = jobs.sbatch("-N4", "--exclusive", f"--output={tmp_path}/%j.out", f"--wrap={task_step(tmp_path, log)}")
    wait_until(lambda: len(task_pids(slurm_cluster, job)) == 4, "a task on each of the 4 nodes")
    before = task_pids(slurm_cluster, job)
    batch_host = jobs.field(job, "BatchHost")

    slurm_cluster.slurm("scontrol", "update", f"JobId={job}", "NumNodes=2")

    wait_until(lambda: jobs.field(job, "NumNodes") == "2", "the job to hold 2 nodes")
    kept = set(slurm_cluster.slurm("scontrol", "show", "hostnames", jobs.field(job, "NodeList")).stdout.split())
    assert len(kept) == 2 and batch_host in kept
    released = set(before) - kept
    wait_until(lambda: not (set(task_pids(slurm_cluster, job)) & released), "the tasks on released nodes to end")
    time.sleep(1.0)  # the kept tasks must still be running a moment later
    assert set(task_pids(slurm_cluster, job)) == kept
    assert jobs.state(job) == "RUNNING"


def test_kill_node_kills_only_that_nodes_task_and_restart_brings_it_back(
    slurm_cluster: LocalCluster, jobs: Jobs, tmp_path: Path
) -> None:
    log = tmp_path / "events.log"
    job = jobs.sbatch(
        "-N4", "--exclusive", "--no-kill", f"--output={tmp_path}/%j.out", f"--wrap={task_step(tmp_path, log)}"
    )
    wait_until(lambda: len(task_pids(slurm_cluster, job)) == 4, "a task on each of the 4 nodes")
    before = task_pids(slurm_cluster, job)
    try:
        killed = slurm_cluster.kill_node("n3")
        assert before["n3"] <= killed
        assert not any(procs.alive(pid) for pid in before["n3"])
        time.sleep(1.0)  # the other nodes' tasks keep running
        assert set(task_pids(slurm_cluster, job)) == {"n1", "n2", "n4"}
        assert all(procs.alive(pid) for node in ("n1", "n2", "n4") for pid in before[node])
        assert "TERM n3" not in log_lines(log)  # died, was not asked to stop
        assert not slurm_cluster.is_up()  # n3's slurmd is gone too
    finally:
        # Not waiting: the job stays COMPLETING on n3 until n3's slurmd is back (or SlurmdTimeout).
        jobs.cancel_all(wait=False)
        slurm_cluster.restart_node("n3")
    slurm_cluster.wait_nodes(["n3"], want_idle=True, timeout_s=60.0)
    assert slurm_cluster.is_up()


def test_recover_nodes_reports_and_resumes_a_drained_node(slurm_cluster: LocalCluster) -> None:
    slurm_cluster.slurm("scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=pytest left it drained")
    found = slurm_cluster.recover_nodes()
    assert [(node, reason) for node, _, reason in found] == [("n2", "pytest left it drained")]
    assert found[0][1].startswith("drain")
    assert slurm_cluster.node_states()["n2"] == "idle"
    assert slurm_cluster.recover_nodes() == []
