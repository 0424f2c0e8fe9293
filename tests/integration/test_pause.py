"""A batch host that goes silent without a TCP reset is noticed within leases; a whole job paused and
resumed (scontrol suspend/resume, SIGSTOP of everything) evicts no one."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.decide import worker as decide
from slurm_elastic.eventtypes import MembershipChange, of_kind
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.testing.threadranks import ThreadJob

from .conftest import SLOW, STEPS, TOLERANCE
from .test_inthread import trainer

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


class Frozen:
    """The coordinator's event loop blocked, as if its host stopped answering (nothing is closed), for up to
    `seconds` or until `thaw()`: a long bound keeps a loaded machine from thawing it before the clients
    gave up, and the test need not wait it out."""

    def __init__(self, job_coordinator: object, seconds: float) -> None:
        self._thaw = threading.Event()
        self._thread = threading.Thread(target=job_coordinator.call, args=(self._thaw.wait, seconds), daemon=True)  # type: ignore[attr-defined]
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def thaw(self) -> None:
        self._thaw.set()
        self._thread.join()


def test_workers_notice_a_silent_coordinator_within_leases() -> None:
    job = ThreadJob(
        trainer(steps=400, gate=lambda step: time.sleep(0.05)), nodes=2, heartbeat_interval_s=0.1, lease_timeout_s=1.0
    ).start()  # 400 steps of 0.05 s: still training when the coordinator falls silent
    try:
        job.wait_step(2)
        frozen = Frozen(job.coordinator, 60.0)
        results = job.join(timeout=50)
        assert frozen.is_alive(), "every rank gave up before the coordinator answered again"
        frozen.thaw()
    finally:
        job.stop()
    assert {(r.ending, r.code) for r in results.values()} == {("coordinator_lost", decide.EXIT_COORDINATOR_LOST)}


def command(corpus: Path, out: Path, steps: int = STEPS) -> list[str]:
    return [
        sys.executable,
        str(SLOW),
        "--data",
        str(corpus),
        "--steps",
        str(steps),
        "--save",
        str(out),
        "--pause",
        "0.2",
    ]


def config(**extra: object) -> JobConfig:
    base = {"nodes": 3, "heartbeat_interval_s": 0.2, "lease_timeout_s": 2.0, "hang_timeout_s": 3.0}
    return JobConfig(**{**base, "max_restarts": 0, "reduce_dtype": "float64", **extra})  # type: ignore[arg-type]


def test_agents_notice_a_silent_coordinator_within_leases(corpus: Path, tmp_path: Path) -> None:
    job = LocalJob(command(corpus, tmp_path / "model.pt", steps=200), config(), root=tmp_path).start()
    try:
        job.wait_until(lambda v: v.last_step >= 2, timeout=120)
        assert job.coordinator is not None
        frozen = Frozen(job.coordinator, 60.0)
        deadline = time.monotonic() + 50  # a lease is 2 s; an agent then stops its workers (10 s grace)
        for proc in job.agents.values():
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        assert frozen.is_alive(), "every agent gave up before the coordinator answered again"
        assert {proc.returncode for proc in job.agents.values()} == {1}
        frozen.thaw()
    finally:
        job.stop()


def test_a_whole_job_paused_and_resumed_evicts_no_one(
    corpus: Path, reference: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    model = tmp_path / "model.pt"
    job = LocalJob(command(corpus, model), config(), root=tmp_path, log_dir=tmp_path / "logs").start()
    try:
        job.wait_until(lambda v: v.last_step >= 4, timeout=120)
        assert job.coordinator is not None
        for proc in job.agents.values():  # every node: agents and workers
            os.killpg(proc.pid, signal.SIGSTOP)
        job.coordinator.call(time.sleep, 8.0)  # the batch host too, four leases long
        for proc in job.agents.values():
            os.killpg(proc.pid, signal.SIGCONT)
        result = job.wait(timeout=240)
        events = job.coordinator.coordinator.events.all()
    finally:
        job.stop()
    assert result.ok, result.reason
    kinds = [e["event"] for e in events]
    assert "coordinator_paused" in kinds
    assert not {"node_unresponsive", "hang_evicted", "node_lost", "worker_exited"} & set(
        kinds[: kinds.index("job_finished")]
    )
    assert [e.world for e in of_kind(events, MembershipChange)][-1] == 3
    assert max_param_rel_diff(torch.load(model), reference) <= TOLERANCE
