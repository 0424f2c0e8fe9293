"""`slurm-elastic reclaim` and `grow` on a local job, run as an operator runs them (separate commands): the
newest node leaves at a step boundary, a new local agent joins with nothing copied by hand, and the job
ends with every sample used exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_elastic.commands.jobs import trains_on
from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import MembershipChange, NodeRegistered, of_kind
from slurm_elastic.jobdir import JobHandle
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.launch.localgrow import choose_local_nodes_to_reclaim, next_node_names, registered_nodes
from slurm_elastic.ledger import analyze
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import request

pytestmark = pytest.mark.timeout(300)

GATED = Path(__file__).with_name("ddp_trainer_gated.py")


def gated_job(tmp_path: Path, *, epochs: int, samples: int, gates: str) -> LocalJob:
    """A 3-node exact-mode local job of the gated DDP trainer, its home, logs and ledger under tmp_path."""
    command = [
        sys.executable, str(GATED), "--epochs", str(epochs), "--samples", str(samples), "--batch-size", "16",
        "--snapshot", str(tmp_path / "snapshot.pt"),
    ]  # fmt: skip
    config = JobConfig(
        nodes=3, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0, progress_interval_s=1000.0,
        ledger_dir=tmp_path / "ledger", reduce_dtype="float64",
    )  # fmt: skip
    return LocalJob(
        command, config, extra_env={"SE_TEST_GATES": gates}, log_dir=tmp_path / "logs", root=tmp_path / "home"
    )


def test_names_are_never_reused_and_the_newest_nodes_leave_first() -> None:
    assert next_node_names(["local1", "local2", "local7", "n1"], 2) == ["local8", "local9"]
    assert next_node_names([], 1) == ["local1"]
    registered = ["local3", "local1", "local2", "local10"]  # the first nodes register in any order
    assert choose_local_nodes_to_reclaim(["local1", "local10", "local2"], registered, 2, "j") == ["local10", "local2"]
    with pytest.raises(Exception, match="job j has 2 node\\(s\\): at most 1 can be given back"):
        choose_local_nodes_to_reclaim(["local1", "local2"], registered, 2, "j")


def test_registered_nodes_come_from_the_events_file_and_never_read_a_device(tmp_path: Path) -> None:
    def registered(node: str) -> dict[str, object]:
        return {"event": "node_registered", **NodeRegistered(node, "host", 1, None).fields()}

    lines = [registered("local2"), {"event": "progress", "step": 3}, registered("local1"), registered("local2")]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"event": "node_reg')
    assert registered_nodes(tmp_path) == ["local2", "local1"], "in order, once each, a torn last line skipped"
    device = tmp_path / "device"
    device.mkdir()
    (device / "events.jsonl").symlink_to("/dev/full")  # reads as endless zeros
    assert registered_nodes(device) == []
    assert registered_nodes(tmp_path / "absent") == []


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_elastic", *args], env=env, capture_output=True, text=True, timeout=150
    )


@pytest.mark.multiproc
def test_reclaim_and_grow_a_local_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "SLURM_ELASTIC_HOME": str(home)}
    g1, g2 = tmp_path / "gate1", tmp_path / "gate2"
    job = gated_job(tmp_path, epochs=3, samples=480, gates=f"6:{g1},14:{g2}")
    grown_pids: list[int] = []
    job.start()
    try:
        job.wait_until(lambda v: v.last_step >= 5, timeout=180)
        reclaimed: list[subprocess.CompletedProcess[str]] = []
        worker = threading.Thread(
            target=lambda: reclaimed.append(cli("reclaim", "--job", job.job_id, "--nodes", "1", env=env))
        )
        worker.start()
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().draining), timeout=60)
        g1.touch()  # the next step carries the drain: the node leaves at its boundary
        worker.join(150)
        assert reclaimed and reclaimed[0].returncode == 0, reclaimed
        assert "draining local3" in reclaimed[0].stdout and "released local3" in reclaimed[0].stdout

        grown = cli("grow", "--job", job.job_id, "--nodes", "1", env=env)
        assert grown.returncode == 0, grown.stderr
        reply = json.loads(grown.stdout.splitlines()[0])
        grown_pids = reply["pids"]
        assert reply["nodes"] == ["local4"], "a name never used before"
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        g2.touch()
        result = job.wait(timeout=180)
    finally:
        g1.touch()
        g2.touch()
        job.stop()
        for pid in grown_pids:
            _wait_or_kill(pid)
    assert result.ok, f"{result.phase}: {result.reason}"
    changes = [(e.cause, e.world) for e in of_kind(read_events(job.dir / "events.jsonl"), MembershipChange)]
    assert [w for _, w in changes] == [3, 2, 3], changes
    assert "drain" in changes[1][0] and "join" in changes[2][0]
    ledger = analyze(tmp_path / "ledger")
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (30, 0, 0)
    assert (job.dir / "nodes" / "local4.log").exists()


def _wait_or_kill(pid: int, timeout: float = 30.0) -> None:
    """The grown agent ends by itself with the job; never leave it behind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    pytest.fail(f"the grown agent {pid} did not end with the job")


def test_an_agent_whose_node_goes_back_by_a_shrink_stays_until_it_is_ended(tmp_path: Path) -> None:
    """`reclaim` on Slurm asks the drained nodes' agents to hold (their workers leave at a step boundary, the
    agent stays) so that Slurm's shrink ends a live task; a signal ends the hold, and the job trains on."""
    gate, after = tmp_path / "gate", tmp_path / "after"  # the drain's step, and one the test lets pass later
    logs = tmp_path / "logs"
    job = gated_job(tmp_path, epochs=2, samples=240, gates=f"6:{gate},9:{after}")
    job.start()
    try:
        job.wait_until(lambda v: v.last_step >= 5, timeout=180)
        handle = JobHandle.read(job.dir)
        drain = msg.DrainRequest(nodes=["local3"], reason="reclaimed", source="reclaim", hold_s=120.0)
        assert isinstance(request(handle.address, drain, secret=handle.secret, job_id=handle.job_id), msg.Ack)
        gate.touch()
        held = logs / "local3.log"
        job.wait_until(lambda v: "node_held_for_slurm" in held.read_text(errors="replace"), timeout=120)
        assert job.coordinator is not None
        status = job.coordinator.status()
        assert not trains_on(status, ["local3"]), "its workers left at the boundary"
        assert "local3" in status.nodes and job.agents["local3"].poll() is None, "its agent holds the node"
        job.kill_node("local3", signal.SIGTERM)  # what Slurm sends first when it ends a task
        assert job.agents["local3"].wait(timeout=30) == 0
        after.touch()
        result = job.wait(timeout=180)
    finally:
        gate.touch()
        after.touch()
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}"
    changes = [e.world for e in of_kind(read_events(job.dir / "events.jsonl"), MembershipChange)]
    assert changes == [3, 2], changes
    ledger = analyze(tmp_path / "ledger")
    assert (ledger.duplicate_samples, ledger.skipped_samples) == (0, 0)
