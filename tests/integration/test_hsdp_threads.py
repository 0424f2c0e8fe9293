"""HSDP under ElasticJob with ranks as threads: a script that asks for shard groups of 2 (`placeholder_mesh(
shard_group=2)`) trains as 2 replica groups of 2 at 4 ranks, as one mirrored shard group at 3 or 5, and goes
back to replica groups when a rank joins. Faults in a shard group's collectives, a replica group's gradient
sum and the commit; every surviving rank ends with the same model as the one-process training (within
float32's tolerance), every sample used once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from slurm_elastic.errors import ConfigError
from slurm_elastic.testing.threadranks import GroupFault, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.sharded.mesh import placeholder_mesh
from tests.integration.test_fsdp_threads import (
    DATA,
    GLOBAL_BATCH,
    MICRO_BATCH,
    assert_exactly_once,
    assert_reference,
    grow_by_one,
    ready_events,
    trainer,
)

pytestmark = pytest.mark.timeout(120)


def test_four_ranks_train_as_two_replica_groups_of_two(tmp_path: Path) -> None:
    job = ThreadJob(trainer(shard_group=2), nodes=4, reduce_dtype="float32", ledger_dir=tmp_path)
    assert_reference(job.run(), world=4)
    assert_exactly_once(tmp_path)
    ready = ready_events(job)[0]
    assert (ready.shard_group, ready.replica_groups, ready.mirrors) == (2, 2, False), ready


@pytest.mark.parametrize(
    ("kind", "nth"),
    # in forward, in backward and in a sum over the replicas, a few steps in
    [("all_gather", 25), ("reduce_scatter", 15), ("allreduce", 9)],
)
def test_a_rank_dying_in_hsdp_is_healed_from_its_replica_and_the_rest_mirror(
    tmp_path: Path, kind: str, nth: int
) -> None:
    # t2 (shard 1 of replica group 0) dies: shard 1's rows come from t4, its replica; 3 ranks cannot form
    # two groups, so they shard over all 3 and mirror each other.
    fault = GroupFault("t2:0:0", 1, nth, "die", kind=kind)  # type: ignore[arg-type]
    job = ThreadJob(trainer(shard_group=2), nodes=4, faults=[fault], reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert results["t2:0:0"].died
    assert_reference(results, world=3)
    assert_exactly_once(tmp_path)
    healed = ready_events(job)[-1]
    assert healed.world == 3 and healed.shard_group == 3 and healed.mirrors is True, healed
    assert healed.resume_step >= 2 and healed.bytes > 0, healed


def test_five_ranks_of_single_shard_groups_lose_three_and_two_go_on(tmp_path: Path) -> None:
    # shard_group=1: every rank holds the whole model (replica groups of one rank, as DDP); any survivor can
    # serve everything. Three ranks die at once, in a sum over the replicas a few steps in; one whose previous
    # sum failed as the first ones died (their groups are closed) dies at the first collective of whichever
    # later generation it is in (the next one can be superseded before any collective when deaths are seen
    # one by one).
    dying = ("t2:0:0", "t3:0:0", "t5:0:0")
    faults = [GroupFault(w, 1, 9, "die", kind="allreduce") for w in dying]
    faults += [GroupFault(w, generation, 1) for w in dying for generation in range(2, 6)]
    job = ThreadJob(trainer(shard_group=1), nodes=5, faults=faults, reduce_dtype="float32", ledger_dir=tmp_path)
    results = job.run()
    assert_reference(results, world=2)
    assert_exactly_once(tmp_path)
    healed = ready_events(job)[-1]
    assert (healed.world, healed.shard_group, healed.replica_groups) == (2, 1, 2), healed
    assert healed.resume_step >= 2, healed


def test_a_joiner_turns_three_mirrored_ranks_into_two_replica_groups(tmp_path: Path) -> None:
    job, results = grow_by_one(3, tmp_path, shard_group=2)
    assert_reference(results, world=4)
    assert_exactly_once(tmp_path)
    first, grown = ready_events(job)[0], ready_events(job)[-1]
    assert (first.shard_group, first.mirrors) == (3, True), first
    assert (grown.world, grown.shard_group, grown.replica_groups, grown.mirrors) == (4, 2, 2, False)
    assert 3 in grown.receivers, grown
    # The groups split from a generation's keep their keys in its namespace: dropped with it, never shared.
    state = job.coordinator.coordinator.store.state
    assert all(isinstance(ns, int) and ns >= grown.generation for ns in state.namespaces()), state.namespaces()


def test_a_bad_shard_group_or_mixed_meshes_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"invalid shard_group 0: expected a whole number of ranks >= 1"):
        placeholder_mesh(shard_group=0)
    with pytest.raises(ConfigError, match=r"invalid shard_group '2'"):
        placeholder_mesh(shard_group="2")  # type: ignore[arg-type]
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    fully_shard(net[0], mesh=placeholder_mesh(shard_group=2))
    fully_shard(net, mesh=placeholder_mesh())
    with pytest.raises(ConfigError, match=r"ask for different shard groups \[None, 2\]: use one mesh"):
        ElasticJob(
            net, torch.optim.AdamW(net.parameters()), dataset=DATA, global_batch=GLOBAL_BATCH,
            micro_batch=MICRO_BATCH, env=worker_env({}), ports=Ports(process_hooks=False),
        )  # fmt: skip
