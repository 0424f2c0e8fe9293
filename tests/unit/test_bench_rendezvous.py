"""`bench rendezvous` at small worlds against the real coordinator: real gloo groups cost the store N + 2 N^2
operations, the simulated ranks' gloo pattern costs exactly what the real groups do, the NCCL pattern one
operation per rank (one per node through the nodes' relays), and a simulated rank without the job's secret
is refused like any other peer."""

from __future__ import annotations

import asyncio

import pytest

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.errors import AuthError
from slurm_elastic.showcase.bench.rendezvous import RendezvousPlan, gloo_store_ops, measure, modelled_ops
from slurm_elastic.testing.swarm import open_store
from slurm_elastic.wire.channel import new_secret

pytestmark = pytest.mark.timeout(120)


def test_real_gloo_groups_cost_n_plus_2_n_squared_and_the_simulated_ranks_the_same() -> None:
    counted = gloo_store_ops((2, 3, 5))
    assert counted == {n: {"set": n, "wait": n * n, "get": n * n} for n in (2, 3, 5)}
    simulated = measure("gloo", 5, RendezvousPlan(processes=2, rounds=2), relay=False)
    assert simulated["store_ops"] == sum(counted[5].values())
    assert simulated["measured"] and simulated["form_s"] > 0 and simulated["store_cpu_s"] > 0


def test_an_nccl_generation_costs_one_operation_per_rank() -> None:
    result = measure("nccl", 40, RendezvousPlan(processes=3, rounds=2), relay=False)
    assert (result["backend"], result["ranks"], result["store_ops"]) == ("nccl", 40, 40)
    assert result["ops_per_s"] > 0


def test_through_relays_an_nccl_generation_costs_one_read_per_node() -> None:
    result = measure("nccl", 40, RendezvousPlan(processes=3, rounds=2, per_node=8), relay=True)
    assert (result["relay"], result["store_ops"]) == (True, 5 + 1)  # a read per node and rank 0's write
    assert result["store_ops"] == modelled_ops("nccl", 40, 8)


def test_through_relays_a_gloo_generation_costs_at_most_what_it_costs_direct() -> None:
    plan = RendezvousPlan(processes=2, rounds=2, per_node=4)
    relayed, direct = measure("gloo", 16, plan, relay=True), measure("gloo", 16, plan, relay=False)
    assert direct["store_ops"] == modelled_ops("gloo", 16, 0) == 16 + 2 * 16 * 16
    assert modelled_ops("gloo", 16, 4) <= relayed["store_ops"] < direct["store_ops"]


def test_a_simulated_rank_without_the_secret_is_refused() -> None:
    coordinator = CoordinatorThread(CoordinatorConfig(job_id="j", secret=new_secret(), expected_workers=1)).start()
    try:
        with pytest.raises((AuthError, ConnectionError, asyncio.IncompleteReadError)):
            asyncio.run(open_store(coordinator.address, str(new_secret()), "j"))
    finally:
        coordinator.stop()
