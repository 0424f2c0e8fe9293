"""The shared SlurmBackend contract against the real local cluster, through CliBackend.

Needs the `slurm_cluster` fixture (tests/slurm/conftest.py, from the devcluster work): a started
`slurm_elastic.testing.devcluster.LocalCluster` with nodes n1..n4 in partition `train`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.slurm.cli_backend import CliBackend
from slurm_elastic.slurm.records import JobInfo
from slurm_elastic.testing.devcluster.shell import find_binary
from slurm_elastic.testing.slurmcontract import CHECKS, Harness
from slurm_elastic.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

# A requeued job is eligible again only after ~120 s, but the checks wait only for states reached
# within seconds; this bound covers a slow slurmctld on a loaded CI machine.
_WAIT_S = 90.0


class ClusterHarness:
    def __init__(self, cluster: Any, tmp_path: Path) -> None:
        env = cluster.env() if callable(getattr(cluster, "env", None)) else {}
        scontrol = find_binary("scontrol")
        self.backend = CliBackend(env=env, bin_dir=Path(scontrol).parent if scontrol else None, timeout=30)
        self.nodes = tuple(getattr(cluster, "nodes", ("n1", "n2", "n3", "n4")))
        self._dir = tmp_path

    def script(self, body: str = "sleep 300") -> Path:
        path = self._dir / "contract.sbatch"
        path.write_text(f"#!/bin/bash\n#SBATCH --output={self._dir}/slurm-%j.out\n{body}\n")
        return path

    def wait_for(self, job_id: str, predicate: Callable[[JobInfo], bool], what: str) -> JobInfo:
        def reached() -> JobInfo | None:
            job = self.backend.job(job_id)
            return job if predicate(job) else None

        return wait_until(reached, timeout=_WAIT_S, what=f"job {job_id} to reach {what}", poll=0.5)


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_cli_backend_keeps_the_contract_on_the_local_cluster(check: str, slurm_cluster: Any, tmp_path: Path) -> None:
    harness: Harness = ClusterHarness(slurm_cluster, tmp_path)
    CHECKS[check](harness)
