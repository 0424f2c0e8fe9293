"""Where members' loops end, as a real coordinator on 127.0.0.1 sees it over real connections: a
heartbeat sent from a step's first micro-batch (a loop may still leave there) is no proof that its loop
went on, whichever member's it is; a heartbeat from past that step's last backward is."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(60)
JOB = "loops"


@pytest.fixture
def members() -> Iterator[tuple[CoordinatorThread, list[ch.Channel]]]:
    config = CoordinatorConfig(
        job_id=JOB, secret=ch.new_secret(), expected_workers=2, heartbeat_interval_s=1.0, lease_timeout_s=30.0
    )
    thread = CoordinatorThread(config).start()
    workers: list[ch.Channel] = []
    try:
        for node in ("n1", "n2"):
            worker = ch.connect(thread.address, secret=config.secret, job_id=JOB, role="worker", timeout=5)
            worker.send(msg.Register(worker_id=f"{node}:0:0", node=node, local_rank=0, pid=1, committed_step=-1))
            assert isinstance(worker.recv(timeout=10), msg.Registered)
            workers.append(worker)
        settle(thread, lambda: thread.view().generation == 1)
        yield thread, workers
    finally:
        for worker in workers:
            worker.close()
        thread.stop()


def settle(thread: CoordinatorThread, predicate: Callable[[], bool] | None = None, seconds: float = 10.0) -> None:
    """Wait for `predicate`, or, without one, long enough for the coordinator to read what was sent."""
    deadline = time.monotonic() + seconds
    while predicate is not None and not predicate():
        assert time.monotonic() < deadline, thread.view()
        time.sleep(0.05)
    if predicate is None:
        time.sleep(0.5)


def test_a_heartbeat_from_the_first_micro_batch_after_the_loops_end_is_not_going_on(
    members: tuple[CoordinatorThread, list[ch.Channel]],
) -> None:
    thread, (one, two) = members
    two.send(msg.Heartbeat(generation=1, step=3, phase="compute"))  # handed step 4's first micro-batch
    one.send(msg.Finished(generation=1, step=3, how="job.micro_batches() left at step 3"))
    one.send(msg.Heartbeat(generation=1, step=3, phase="compute"))  # its own, sent before it left
    settle(thread)
    assert thread.view().phase == "running", thread.view().reason
    two.send(msg.Finished(generation=1, step=3, how="job.micro_batches() left at step 3"))
    settle(thread, lambda: thread.view().phase != "running")
    assert thread.view().phase == "finished", thread.view().reason


def test_a_heartbeat_past_the_steps_last_backward_after_a_loops_end_fails_the_job(
    members: tuple[CoordinatorThread, list[ch.Channel]],
) -> None:
    thread, (one, two) = members
    one.send(msg.Finished(generation=1, step=3, how="job.micro_batches() left at step 3"))
    two.send(msg.Heartbeat(generation=1, step=3, phase="allreduce"))  # summing step 4's gradients
    settle(thread, lambda: thread.view().phase != "running")
    reason = thread.view().reason or ""
    assert thread.view().phase == "failed" and "n1:0:0 at step 3" in reason and "n2:0:0 went on to step 4" in reason
