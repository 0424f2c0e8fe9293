"""The admin hooks on the real local cluster: the cluster is restarted with the hooks installed for this
module, and brought back as it was afterwards.

A real coordinator runs in the test; a Slurm job whose comment names its handle stands for the elastic
job. Assertions follow the order of events (what the coordinator received, what the hooks logged),
never wall-clock times.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic import waiting
from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.eventtypes import DrainRequested, of_kind
from slurm_elastic.hooks.bench import hooks_dir_of, restart_cluster
from slurm_elastic.hooks.check import check_installation
from slurm_elastic.hooks.install import InstallOptions, install
from slurm_elastic.jobdir import JobHandle, hook_comment
from slurm_elastic.slurm import CliBackend, NodeInfo
from slurm_elastic.testing.devcluster import LocalCluster
from slurm_elastic.wire.channel import new_secret

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

NAME = "pytest-hooks"
HUGE_MB = 10**12


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    return waiting.wait_until(predicate, timeout=timeout_s, what=what, poll=0.2)


@dataclass
class Hooked:
    cluster: LocalCluster
    prefix: Path
    base_config: str

    def configure(self, extra: str = "") -> None:
        """Rewrite hooks.toml; the next health check of every node runs its full checks at once."""
        (self.prefix / "hooks.toml").write_text(self.base_config + extra)
        for state in (self.prefix / "state").glob("healthcheck.*.json"):
            state.unlink()

    def log(self) -> list[str]:
        path = self.prefix / "log" / "hooks.log"
        return path.read_text().splitlines() if path.exists() else []

    def node(self, name: str) -> NodeInfo:
        return CliBackend(env=self.cluster.env()).nodes([name])[0]

    def sbatch(self, *args: str) -> str:
        out = self.cluster.slurm("sbatch", "--parsable", f"--job-name={NAME}", "--output=/dev/null", *args).stdout
        return out.strip().split(";")[0]

    def job_field(self, job: str, key: str) -> str:
        text = self.cluster.slurm("scontrol", "show", "job", "-o", job, check=False).stdout
        match = re.search(rf"(?:^|\s){key}=(\S*)", text)
        return match.group(1) if match else ""

    def clean(self) -> None:
        ids = self.cluster.slurm("squeue", "-h", f"--name={NAME}", "-o", "%A").stdout.split()
        for job in ids:
            self.cluster.slurm("scancel", job, check=False)
        wait_until(lambda: not self.cluster.slurm("squeue", "-h", f"--name={NAME}").stdout.strip(), "jobs to leave")
        self.configure()
        bad = [n for n, s in self.cluster.node_states().items() if s.startswith(("drain", "fail"))]
        if bad:
            self.cluster.slurm("scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME")
        self.cluster.wait_nodes(self.cluster.nodes, want_idle=True, timeout_s=60.0)


@pytest.fixture(scope="module")
def hooked(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooked]:
    prefix = tmp_path_factory.mktemp("hooks")
    install(
        InstallOptions(
            prefix=prefix,
            python=Path(sys.executable),
            slurm_conf=slurm_cluster.slurm_conf_path,
            state_dir=prefix / "state",
            cache_dir=str(prefix / "cache" / "%n"),  # all four nodes share this machine's /dev/shm
        )
    )
    base = (prefix / "hooks.toml").read_text() + "syslog = false\n"
    (prefix / "hooks.toml").write_text(base)
    before = hooks_dir_of(slurm_cluster)
    restart_cluster(slurm_cluster, prefix)
    try:
        yield Hooked(slurm_cluster, prefix, base)
    finally:
        restart_cluster(slurm_cluster, before)


@pytest.fixture
def hooks(hooked: Hooked) -> Iterator[Hooked]:
    hooked.configure()
    try:
        yield hooked
    finally:
        hooked.clean()


@dataclass
class ElasticJob:
    slurm_job: str
    coordinator: CoordinatorThread

    def drains(self, source: str) -> list[DrainRequested]:
        return [e for e in of_kind(self.coordinator.coordinator.events.all(), DrainRequested) if e.source == source]


@pytest.fixture
def elastic_job(hooks: Hooked, tmp_path: Path) -> Iterator[Callable[..., ElasticJob]]:
    """Starts a 'core job': a held sbatch job, a coordinator named after it, its handle, then release."""
    started: list[CoordinatorThread] = []

    def start(nodes: int) -> ElasticJob:
        job_dir = tmp_path / "home" / "jobs" / "core"
        up = tmp_path / "up"  # one file per node whose task runs
        up.mkdir()
        task = f"touch {shlex.quote(str(up))}/$SLURMD_NODENAME && exec sleep 300"
        step = f"srun --no-kill --ntasks-per-node=1 bash -c {shlex.quote(task)}"
        job = hooks.sbatch("--hold", f"--comment={hook_comment(job_dir)}", f"-N{nodes}", "--wrap", step)
        secret = new_secret()
        config = CoordinatorConfig(
            job_id=job,
            secret=secret,
            expected_workers=4,
            events_path=job_dir / "events.jsonl",
            host=hooks.cluster.controller_address,  # where the nodes' hooks reach this process
        )
        thread = CoordinatorThread(config).start()
        started.append(thread)
        JobHandle(job, thread.address, secret, "localhost", 0, time.time()).write(job_dir)
        hooks.cluster.slurm("scontrol", "release", job)
        # Running means more than the job's state, or its step's: the step's task runs on every node. (A
        # shrink while a task still starts there fails the step, and the whole job ends with it.)
        wait_until(lambda: len(list(up.iterdir())) == nodes, f"the tasks of job {job} to run on {nodes} nodes")
        return ElasticJob(job, thread)

    try:
        yield start
    finally:
        for thread in started:
            thread.stop()


def test_prolog_drains_an_unhealthy_node_and_the_job_does_not_start_there(hooks: Hooked, tmp_path: Path) -> None:
    # Only the prolog judges n3: its health check keeps its hands off.
    hooks.configure(f"[node.n3]\nmin_free_shm_mb = {HUGE_MB}\nhealthcheck_checks = false\n")
    marker = tmp_path / "ran"
    job = hooks.sbatch("-N1", "-w", "n3", "--wrap", f"touch {marker}")
    node = wait_until(lambda: (n := hooks.node("n3")).drain and n, "the prolog to drain n3")
    assert node.reason.startswith("slurm-elastic prolog: shm: ")
    wait_until(lambda: hooks.job_field(job, "Restarts") == "1", f"job {job} to be requeued")
    wait_until(lambda: hooks.job_field(job, "JobState") == "PENDING", f"job {job} to wait again")
    assert not marker.exists()
    assert any(f"prolog job={job} node=n3 action=check result=unhealthy" in line for line in hooks.log())


def test_a_failing_health_check_keeps_a_node_out_of_new_jobs(hooks: Hooked, tmp_path: Path) -> None:
    hooks.configure(f"[node.n2]\nmin_free_shm_mb = {HUGE_MB}\nprolog = false\n")
    node = wait_until(lambda: (n := hooks.node("n2")).drain and n, "the health check to drain n2")
    assert node.reason.startswith("slurm-elastic healthcheck: shm: ")
    marker = tmp_path / "ran"
    job = hooks.sbatch("-N1", "-w", "n2", "--wrap", f"touch {marker}")
    # Several scheduler passes (every 2 s here): the job waits for its node.
    for _ in range(3):
        hooks.cluster.slurm("scontrol", "schedule", check=False)
        time.sleep(2)
        assert hooks.job_field(job, "JobState") == "PENDING" and not marker.exists()
    hooks.configure()  # healthy again: the health check lifts its own drain, and the job runs
    wait_until(marker.exists, f"job {job} to run on n2 once it is healthy")
    lines = [line for line in hooks.log() if "healthcheck" in line and "node=n2 action=set_state" in line]
    assert [re.search(r"state=(\w+)", line).group(1) for line in lines] == ["DRAIN", "RESUME"]  # type: ignore[union-attr]


def test_a_shrink_is_reported_by_the_epilog_of_each_released_node(
    hooks: Hooked, elastic_job: Callable[..., ElasticJob]
) -> None:
    job = elastic_job(4)
    hooks.cluster.slurm("scontrol", "update", f"JobId={job.slurm_job}", "NumNodes=2")
    drains = wait_until(lambda: len(d := job.drains("epilog")) >= 2 and d, "the epilogs of n3 and n4")
    assert sorted(n for d in drains for n in d.nodes) == ["n3", "n4"]
    assert all(d.mode == "now" and "left running job" in d.reason for d in drains)
    events = [e["event"] for e in job.coordinator.coordinator.events.all()]
    # Reported before any heartbeat timeout: the coordinator never had to notice the nodes by itself.
    assert "node_unresponsive" not in events and "hang_evicted" not in events
    assert hooks.job_field(job.slurm_job, "NodeList") == "n[1-2]"


def test_scontrol_drain_and_fail_reach_the_job_once_each(hooks: Hooked, elastic_job: Callable[..., ElasticJob]) -> None:
    job = elastic_job(4)
    hooks.cluster.slurm("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=pytest maintenance")
    (drain,) = wait_until(lambda: job.drains("healthcheck"), "the health check to report n3's drain")
    assert (drain.nodes, drain.mode) == (("n3",), "boundary")
    assert "Slurm marks n3 DRAIN: pytest maintenance" in drain.reason
    hooks.cluster.slurm("scontrol", "update", "NodeName=n4", "State=FAIL", "Reason=pytest failing")
    wait_until(lambda: len(job.drains("healthcheck")) == 2, "the health check to report n4's failure")
    fail = job.drains("healthcheck")[1]
    assert (fail.nodes, fail.mode) == (("n4",), "now")
    # More health check runs (every 2 s on every node, each watching): nothing is told twice, and nothing
    # more is logged about it. A run logs its notice once the coordinator answered, maybe after the drain
    # shows; a run that overran under load says only that ("busy").
    told = lambda: [line for line in hooks.log() if "healthcheck" in line and "action=notify" in line]  # noqa: E731
    wait_until(lambda: len(told()) == 2, "the health checks to log both notices")
    settled = [line for line in hooks.log() if "result=busy" not in line]
    time.sleep(5)
    assert len(job.drains("healthcheck")) == 2
    assert [line for line in hooks.log() if "result=busy" not in line] == settled


def test_hooks_check_accepts_the_running_clusters_installation(hooks: Hooked) -> None:
    findings = check_installation(hooks.prefix, hooks.cluster.slurm_conf_path)
    assert [str(f) for f in findings if f.level != "ok"] == []
