"""The shared backend contract (slurm_elastic.testing.slurmcontract) against FakeSlurm; tests/slurm runs it
against the real local cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_elastic.slurm.records import JobInfo
from slurm_elastic.testing.fakeslurm import FakeClock, FakeSlurm
from slurm_elastic.testing.slurmcontract import CHECKS, Harness


class FakeHarness:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.fake = FakeSlurm("n[1-4]", clock=self.clock.now)
        self.backend = self.fake
        self.nodes = ("n1", "n2", "n3", "n4")
        self._dir = tmp_path

    def script(self, body: str = "sleep 300") -> Path:
        path = self._dir / "contract.sbatch"
        path.write_text(f"#!/bin/bash\n{body}\n")
        return path

    def wait_for(self, job_id: str, predicate: Callable[[JobInfo], bool], what: str) -> JobInfo:
        # "Time passes" as scheduler passes and clock steps; nothing sleeps.
        for _ in range(5):
            self.fake.start_pending()
            job = self.fake.job(job_id)
            if predicate(job):
                return job
            self.clock.advance(60)
        raise AssertionError(f"job {job_id} never reached {what}: {self.fake.job(job_id)}")


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_fake_keeps_the_backend_contract(check: str, tmp_path: Path) -> None:
    harness: Harness = FakeHarness(tmp_path)
    CHECKS[check](harness)
