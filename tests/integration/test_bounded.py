"""Resources stay bounded over many membership changes: after 100 generations a worker process holds as many
descriptors and the coordinator as much bookkeeping as after 5 (ranks as threads, so one process to watch)."""

from __future__ import annotations

import os
import time

import pytest

from slurm_elastic.decide import membership as m
from slurm_elastic.eventtypes import GenerationReady, of_kind
from slurm_elastic.testing.threadranks import ThreadJob
from slurm_elastic.waiting import wait_until
from slurm_elastic.worker.membership.comm import REAPER

from .test_inthread import trainer

pytestmark = pytest.mark.timeout(240)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def quiet() -> None:
    """Wait until every abandoned group has been released."""
    deadline = time.monotonic() + 30
    while REAPER.holding():
        assert time.monotonic() < deadline, "abandoned process groups are never released"
        time.sleep(0.05)
    time.sleep(0.3)


def bookkeeping(job: ThreadJob) -> dict[str, int]:
    coord = job.coordinator.coordinator
    return {
        "workers": len(coord.workers),
        "members": len(coord.state.workers),
        "registered": coord.scripts.registrations(),
        "early_exits": len(coord.scripts.early_exits),
        "tracebacks": len(coord.scripts.tracebacks),
        "raised": coord.scripts.pending_causes(),
        "drained": len(coord.drained_nodes),
        "events": len(coord.events.all()),
    }


def new_generation(job: ThreadJob) -> None:
    """Make the coordinator re-form the group (as after a collective failure) and wait for it to be in sync."""
    coord = job.coordinator.coordinator
    before = job.coordinator.view().generation
    member = job.coordinator.call(lambda: coord.state.members[0])
    job.coordinator.call(coord.driver.feed, m.Faulted(member, before, "forced by the test"))
    formed = lambda: any(e.generation == before + 1 for e in of_kind(coord.events.recent(20), GenerationReady))  # noqa: E731
    wait_until(formed, timeout=30, what=f"generation {before + 1} to form", poll=0.01)


def test_a_hundred_generations_leak_no_descriptors_and_no_bookkeeping() -> None:
    job = ThreadJob(trainer(steps=100_000, gate=lambda step: time.sleep(0.01)), nodes=3, pg_timeout_s=5.0).start()
    try:
        job.wait_step(2)
        for _ in range(5):
            new_generation(job)
        quiet()
        fds_5, books_5 = open_descriptors(), bookkeeping(job)
        for _ in range(100):
            new_generation(job)
        quiet()
        fds_105, books_105 = open_descriptors(), bookkeeping(job)
        assert job.coordinator.view().generation >= 106
    finally:
        job.coordinator.call(job.coordinator.coordinator.driver.feed, m.Abort("the test is over"))
        job.join(timeout=60)
        job.stop()
    assert fds_105 <= fds_5 + 2, f"descriptors: {fds_5} after 5 generations, {fds_105} after 105"
    assert books_105["events"] <= 500 and {k: v for k, v in books_105.items() if k != "events"} == {
        k: v for k, v in books_5.items() if k != "events"
    }
