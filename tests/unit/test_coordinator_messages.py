"""A malformed but authenticated message costs that message: the worker stays, the coordinator goes on."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.eventtypes import ControlLoopFailed, GenerationReady, JobFinished, of_kind
from slurm_elastic.waiting import wait_until
from slurm_elastic.wire.channel import Channel, connect, new_secret
from slurm_elastic.wire.messages import Committed, Heartbeat, Register, Registered, WorkerEvent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def coordinator() -> Iterator[CoordinatorThread]:
    thread = CoordinatorThread(CoordinatorConfig(job_id="j", secret=new_secret(), expected_workers=2)).start()
    try:
        yield thread
    finally:
        thread.stop()


def registered(coordinator: CoordinatorThread) -> Channel:
    config = coordinator.coordinator.config
    channel = connect(coordinator.address, secret=config.secret, job_id="j", role="worker")
    channel.send(Register(worker_id="n1:0:0", node="n1", local_rank=0, pid=1, committed_step=-1))
    assert isinstance(channel.recv(timeout=10), Registered)
    return channel


def dropped(coordinator: CoordinatorThread) -> list[dict[str, object]]:
    return [e for e in coordinator.coordinator.events.all() if e["event"] == "message_dropped"]


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    wait_until(predicate, timeout=timeout, what="the coordinator", poll=0.01)


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"type": "no_such_message"}', b'{"type": "heartbeat", "generation": -1, "step": 0, "phase": "x"}'],
)
def test_an_invalid_frame_is_dropped_and_the_worker_stays(coordinator: CoordinatorThread, body: bytes) -> None:
    channel = registered(coordinator)
    channel._sock.sendall(struct.pack(">I", len(body)) + body)
    channel.send(Heartbeat(generation=0, step=3, phase="compute"))
    wait_for(lambda: coordinator.coordinator.workers.get("n1:0:0") is not None and dropped(coordinator))
    time.sleep(0.2)
    assert "n1:0:0" in coordinator.coordinator.workers, "the worker is still connected"
    assert coordinator.coordinator.workers["n1:0:0"].step == 3, "the next message was read"
    assert dropped(coordinator)[0]["sender"] == "n1:0:0"
    channel.close()


def test_a_message_the_coordinator_cannot_act_on_is_dropped(coordinator: CoordinatorThread) -> None:
    channel = registered(coordinator)
    channel.send(WorkerEvent(kind="generation_ready", fields={"resume_step": "not a number"}))
    channel.send(WorkerEvent(kind="checkpoint_failed", fields={"worker": "spoofed", "job": "other", "error": "x"}))
    wait_for(lambda: any(e["event"] == "checkpoint_failed" for e in coordinator.coordinator.events.all()))
    assert "ValueError" in str(dropped(coordinator)[0]["reason"])
    failed = next(e for e in coordinator.coordinator.events.all() if e["event"] == "checkpoint_failed")
    assert (failed["worker"], failed["job"]) == ("n1:0:0", "j"), "a worker cannot overwrite who and which job"
    assert "n1:0:0" in coordinator.coordinator.workers
    channel.close()


def test_a_step_rank_0_took_from_a_peer_is_where_the_job_is(coordinator: CoordinatorThread) -> None:
    """A fault between the ranks' commits of step 39: rank 0 committed 38 and took 39 from a peer as the next
    generation formed; `status` says 39, and a later resume from an older checkpoint takes nothing back."""
    channel = registered(coordinator)
    channel.send(Committed(generation=1, step=38, loss=1.0, samples=8, world=2, time=0.0))
    wait_for(lambda: coordinator.coordinator.view().last_step == 38)
    channel.send(WorkerEvent(kind="generation_ready", fields=_ready(generation=2, resume_step=39)))
    wait_for(lambda: coordinator.coordinator.view().last_step == 39)
    channel.send(WorkerEvent(kind="generation_ready", fields=_ready(generation=3, resume_step=30)))
    wait_for(lambda: len(of_kind(coordinator.coordinator.events.all(), GenerationReady)) == 2)
    assert coordinator.coordinator.view().last_step == 39
    ready = of_kind(coordinator.coordinator.events.all(), GenerationReady)
    assert [e.lost_committed_steps for e in ready] == [0, 9]
    assert {e.worker for e in ready} == {"n1:0:0"}  # the coordinator names the sender
    channel.close()


def test_a_worker_cannot_report_what_only_the_coordinator_says(coordinator: CoordinatorThread) -> None:
    channel = registered(coordinator)
    channel.send(WorkerEvent(kind="job_finished", fields={"reason": "spoofed", "step": 99}))
    wait_for(lambda: dropped(coordinator))
    assert "a worker cannot report a 'job_finished' event" in str(dropped(coordinator)[0]["reason"])
    assert of_kind(coordinator.coordinator.events.all(), JobFinished) == []
    channel.send(WorkerEvent(kind="control_loop_failed", fields={"reason": "its control thread died"}))
    wait_for(lambda: of_kind(coordinator.coordinator.events.all(), ControlLoopFailed))
    (died,) = of_kind(coordinator.coordinator.events.all(), ControlLoopFailed)
    assert (died.worker, died.reason, died.loop) == ("n1:0:0", "its control thread died", None)
    channel.close()


def test_a_generation_report_without_a_field_of_its_kind_is_dropped_by_name(coordinator: CoordinatorThread) -> None:
    channel = registered(coordinator)
    fields = _ready(generation=2, resume_step=3)
    del fields["sources"]
    channel.send(WorkerEvent(kind="generation_ready", fields=fields))
    wait_for(lambda: dropped(coordinator))
    assert "a generation_ready event without 'sources'" in str(dropped(coordinator)[0]["reason"])
    assert of_kind(coordinator.coordinator.events.all(), GenerationReady) == []
    assert "n1:0:0" in coordinator.coordinator.workers
    channel.close()


def _ready(*, generation: int, resume_step: int) -> dict[str, Any]:
    """What a worker's rank 0 sends of a formed generation (the coordinator adds who sent it)."""
    sent = GenerationReady("", generation, "join", 2, 0.1, 0.1, 0.2, resume_step, (1,), (0,), 10, "joiner").fields()
    del sent["worker"]
    return sent
