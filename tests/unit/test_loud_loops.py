"""A control loop that dies, for whatever reason, never dies silently: the coordinator's ticker fails the job
with the reason, a connection task's death is on record, an agent whose thread died exits failed and tells
the coordinator why, and a worker whose control thread died says why and leaves the job (before: the loop's
thread or task ended quietly and its duty with it; a lease later, if ever, someone noticed the silence)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from slurm_elastic.agent import EXIT_FAILED
from slurm_elastic.config import JobConfig
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.decide.worker import EXIT_JOB_FAILED
from slurm_elastic.eventtypes import ControlLoopFailed, E, WorkerExited, of_kind
from slurm_elastic.launch.slurm import SlurmLaunch
from slurm_elastic.testing.fakeslurm import FakeSlurm
from slurm_elastic.waiting import holds_within
from slurm_elastic.wire import messages as msg
from slurm_elastic.wire.channel import Channel, connect, new_secret
from slurm_elastic.worker.membership.comm import Interrupt
from slurm_elastic.worker.membership.control import ControlClient, ControlFailed, Identity
from slurm_elastic.worker.membership.runtime import Runtime, WorkerEnded

pytestmark = pytest.mark.timeout(60)
SECRET = new_secret()


def boom(*_: object) -> None:
    raise RuntimeError("boom")


@pytest.fixture
def coordinator() -> Iterator[CoordinatorThread]:
    config = CoordinatorConfig(
        job_id="j", secret=SECRET, expected_workers=2, heartbeat_interval_s=0.05, lease_timeout_s=5.0
    )
    thread = CoordinatorThread(config).start()
    try:
        yield thread
    finally:
        thread.stop()


def register_agent(address: str, node: str = "n1") -> Channel:
    channel = connect(address, secret=SECRET, job_id="j", role="agent")
    channel.send(msg.RegisterNode(node=node, host="h", nproc=1, pid=os.getpid()))
    assert isinstance(channel.recv(timeout=10), msg.Ack)
    return channel


def next_stop(channel: Channel, timeout: float = 10) -> msg.Stop:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = channel.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(message, msg.Stop):
            return message
    raise AssertionError("no Stop came")


def events_of(thread: CoordinatorThread, kind: type[E]) -> list[E]:
    return of_kind(thread.coordinator.events.all(), kind)


def wait_for(check: Any, timeout: float = 15) -> bool:
    return holds_within(check, timeout=timeout)


# --- the coordinator -------------------------------------------------------------------------------


def test_a_ticker_that_dies_fails_the_job_and_stops_everyone_with_the_reason(coordinator: CoordinatorThread) -> None:
    agent = register_agent(coordinator.address)
    try:
        coordinator.coordinator.ticker.tick = boom  # type: ignore[method-assign]  # its next tick raises
        assert coordinator.coordinator.done.wait(10), "the job ends at once, not a lease later"
        stop = next_stop(agent)
    finally:
        agent.close()
    view = coordinator.view()
    assert view.phase == "failed"
    assert "the coordinator's ticker died: RuntimeError: boom" in view.reason
    assert stop.error is not None and "RuntimeError: boom" in stop.error
    [died] = events_of(coordinator, ControlLoopFailed)
    assert died.loop == "ticker" and "boom" in died.reason


def test_a_connection_task_that_dies_is_on_record_and_the_job_goes_on(
    coordinator: CoordinatorThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(coordinator.coordinator, "serve_agent", broken)
    channel = connect(coordinator.address, secret=SECRET, job_id="j", role="agent")
    try:
        channel.send(msg.RegisterNode(node="n1", host="h", nproc=1, pid=os.getpid()))
        assert wait_for(lambda: events_of(coordinator, ControlLoopFailed))
    finally:
        channel.close()
    [died] = events_of(coordinator, ControlLoopFailed)
    assert died.loop == "connection" and "RuntimeError: boom" in died.reason
    assert coordinator.view().phase == "rendezvous", "one peer's connection does not stop the job"
    monkeypatch.undo()
    register_agent(coordinator.address, "n2").close()  # the coordinator still serves the others


def test_a_cancelled_ticker_is_a_shutdown_not_a_death(coordinator: CoordinatorThread) -> None:
    coordinator.stop()
    assert events_of(coordinator, ControlLoopFailed) == [] and coordinator.view().phase == "rendezvous"


def test_a_slurm_launchers_watch_loop_that_breaks_fails_the_job_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_ELASTIC_HOME", str(tmp_path / "home"))
    slurm = FakeSlurm("n[1-2]")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/sh\n")
    job = slurm.submit(script, args=["--nodes=2"])
    slurm.start_pending()
    launch = SlurmLaunch(JobConfig(node_watch_interval_s=0.01), ["train"], slurm, job)
    launch.coordinator = CoordinatorThread(CoordinatorConfig(job_id=job, secret=SECRET, expected_workers=2)).start()
    monkeypatch.setattr(launch, "_watch_nodes", boom)  # Slurm answers something the watch cannot take
    try:
        phase = launch.watch()  # before: the exception left the batch script, and its coordinator with it
        view = launch.coordinator.view()
        events = launch.coordinator.coordinator.events.all()
    finally:
        launch.finish("failed")
    assert phase == "failed" and view.phase == "failed"
    assert "the launcher's watch loop died: RuntimeError: boom" in view.reason
    assert [e["loop"] for e in events if e["event"] == "control_loop_failed"] == ["launcher"]


# --- the agent -------------------------------------------------------------------------------------

# The agent as `slurm-elastic agent` runs it, but with a heartbeat thread that raises at once.
AGENT_WITH_A_BROKEN_HEARTBEAT = """
import sys
from slurm_elastic import agent

def broken(self):
    raise RuntimeError("boom")

agent.Agent._heartbeat_loop = broken
sys.exit(agent.main(sys.argv[1:]))
"""


def test_an_agent_whose_thread_dies_ends_its_workers_exits_failed_and_says_why(
    coordinator: CoordinatorThread,
) -> None:
    worker = [sys.executable, "-c", "import time; time.sleep(120)"]
    argv = [sys.executable, "-c", AGENT_WITH_A_BROKEN_HEARTBEAT, "--coordinator", coordinator.address,
            "--job-id", "j", "--node", "n1", "--", *worker]  # fmt: skip
    env = {**os.environ, "SLURM_ELASTIC_SECRET": SECRET}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=30)  # before: it ran on, with no heartbeat, until its worker ended
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == EXIT_FAILED
    assert "agent_failed" in stderr and "se-agent-heartbeat thread died: RuntimeError: boom" in stderr
    leftovers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], "its worker ended with it"
    assert wait_for(lambda: events_of(coordinator, ControlLoopFailed) and events_of(coordinator, WorkerExited))
    [died] = events_of(coordinator, ControlLoopFailed)
    assert died.node == "n1" and "RuntimeError: boom" in died.reason
    assert [e.will_restart for e in events_of(coordinator, WorkerExited)] == [False], "ended, not restarted"


# --- the worker ------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["_heartbeat_loop", "_read_loop"])
def test_a_worker_whose_control_thread_dies_says_why_and_is_woken_to_leave(
    coordinator: CoordinatorThread, loop: str
) -> None:
    interrupt = Interrupt()
    client = ControlClient(coordinator.address, SECRET, Identity("j", "n1:0:0", "n1", 0), interrupt)
    setattr(client, loop, boom)  # the thread's body raises at once
    try:
        client.register(committed_step=0, pid=os.getpid())
        assert wait_for(interrupt.is_set, 10), "the training thread is woken, not left to a lease expiry"
        with pytest.raises(ControlFailed, match="RuntimeError: boom"):
            client.next_announcement(0, timeout=5)
        assert wait_for(lambda: events_of(coordinator, ControlLoopFailed))
    finally:
        client.close()
    [died] = events_of(coordinator, ControlLoopFailed)
    assert died.worker == "n1:0:0" and "RuntimeError: boom" in died.reason


def test_a_failed_control_connection_ends_the_worker_as_a_crash() -> None:
    class Failed:
        def next_announcement(self, after: int, timeout: float | None = None) -> None:
            raise ControlFailed("the se-heartbeat thread died: RuntimeError: boom")

    runtime = Runtime(
        SimpleNamespace(), SimpleNamespace(process_hooks=False), SimpleNamespace(), Interrupt(), torch.device("cpu")
    )  # type: ignore[arg-type]
    runtime.control = Failed()  # type: ignore[assignment]
    with pytest.raises(WorkerEnded) as ended:
        runtime._next_announcement(False, SimpleNamespace(step=3, fresh=False))  # type: ignore[arg-type]
    ending = ended.value.ending
    assert ending.kind == "control_failed" and ending.code == EXIT_JOB_FAILED and "boom" in ending.reason


def test_a_loop_ended_by_cancellation_is_not_reported() -> None:
    from slurm_elastic.loops import run_loudly

    deaths: list[str] = []

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(run_loudly(asyncio.sleep(60), "sleeper", deaths.append))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert deaths == []
