"""`bench rendezvous` at small worlds against the real coordinator: real gloo groups cost the store N + 2 N^2
operations, the simulated ranks' gloo pattern costs exactly what the real groups do, the NCCL pattern one
operation per rank, and a simulated rank without the job's secret is refused like any other peer."""

from __future__ import annotations

import asyncio

import pytest

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.errors import AuthError
from slurm_elastic.showcase.bench.rendezvous import RendezvousPlan, gloo_store_ops, measure
from slurm_elastic.testing.swarm import open_store
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(120)


def test_real_gloo_groups_cost_n_plus_2_n_squared_and_the_simulated_ranks_the_same() -> None:
    counted = gloo_store_ops((2, 3, 5))
    assert counted == {n: {"set": n, "wait": n * n, "get": n * n} for n in (2, 3, 5)}
    simulated = measure("gloo", 5, RendezvousPlan(processes=2, rounds=2))
    assert simulated["store_ops"] == sum(counted[5].values())
    assert simulated["measured"] and simulated["form_s"] > 0 and simulated["store_cpu_s"] > 0


def test_an_nccl_generation_costs_one_operation_per_rank() -> None:
    result = measure("nccl", 40, RendezvousPlan(processes=3, rounds=2))
    assert (result["backend"], result["ranks"], result["store_ops"]) == ("nccl", 40, 40)
    assert result["ops_per_s"] > 0


def test_a_simulated_rank_without_the_secret_is_refused() -> None:
    coordinator = CoordinatorThread(CoordinatorConfig(job_id="j", secret=new_secret(), expected_workers=1)).start()
    try:
        with pytest.raises((AuthError, ConnectionError, asyncio.IncompleteReadError)):
            asyncio.run(open_store(coordinator.address, str(new_secret()), "j"))
    finally:
        coordinator.stop()
