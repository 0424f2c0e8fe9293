"""Shard layouts of a sharded generation: HSDP replica groups where the world and the nodes allow, else one
mirrored shard group; exhaustive over small worlds, node placements and shard group sizes."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from slurm_elastic.decide.reshard import mirrors
from slurm_elastic.decide.shardlayout import Layout, plan_layout, shard_group_size

pytestmark = pytest.mark.timeout(120)


def test_the_shard_group_is_the_smallest_divisor_of_the_world_at_least_as_large_as_asked() -> None:
    for world, wanted in itertools.product(range(1, 25), range(1, 25)):
        size = shard_group_size(world, wanted)
        assert world % size == 0 and size >= min(wanted, world)
        assert not any(world % d == 0 for d in range(min(wanted, world), size)), (world, wanted, size)
    assert [shard_group_size(w, 2) for w in (1, 2, 3, 4, 5, 6, 7, 8)] == [1, 2, 3, 2, 5, 2, 7, 2]
    with pytest.raises(ValueError, match="invalid world 0 or shard group 2"):
        shard_group_size(0, 2)
    with pytest.raises(ValueError, match="invalid world 4 or shard group 0"):
        shard_group_size(4, 0)


def check(layout: Layout, nodes: list[str], wanted: int | None) -> None:
    world = len(nodes)
    assert layout.world == world and world % layout.shards == 0
    members = [f"m{r}" for r in range(world)]
    needs = layout.needs(members)
    primaries = [n for n in needs if n.role == "primary"]
    assert [n.member for n in primaries] == members and all(n.world == layout.shards for n in needs)
    assert Counter(n.index for n in primaries) == {j: layout.replicas for j in range(layout.shards)}
    for rank in range(world):  # the groups partition the ranks: a shard group holds every shard once
        assert sorted(layout.index(r) for r in layout.shard_group(rank)) == list(range(layout.shards))
        assert {layout.index(r) for r in layout.replica_group(rank)} == {layout.index(rank)}
        assert rank in layout.shard_group(rank) and rank in layout.replica_group(rank)
        assert len(layout.replica_group(rank)) == layout.replicas
    if layout.replicas == 1:  # one shard group: the mirrors hold the second copies
        assert layout.shards == world and layout.wards == mirrors(nodes)
        mirrored = [n for n in needs if n.role == "mirror"]
        assert len(mirrored) == (world if layout.wards is not None else 0)
    else:  # HSDP: the replicas hold the second copies, on other nodes; nothing is mirrored
        assert wanted is not None and layout.wards is None and "HSDP" in layout.reason
        assert layout.shards == shard_group_size(world, wanted)
        for j in range(layout.shards):
            assert len({nodes[r] for r in range(j, world, layout.shards)}) >= 2
    if wanted is None:
        assert layout.replicas == 1
    else:  # never a larger shard per rank than the script planned for
        assert layout.shards >= min(wanted, world)
        spread = all(
            len({nodes[r] for r in range(j, world, size)}) >= 2
            for size in [shard_group_size(world, wanted)]
            for j in range(size)
        )
        assert (layout.replicas >= 2) == (world // shard_group_size(world, wanted) >= 2 and spread)


def test_every_layout_of_up_to_six_ranks_on_up_to_three_nodes() -> None:
    checked = 0
    for world in range(1, 7):
        for placement in itertools.product("abc", repeat=world):
            nodes = list(placement)
            for wanted in (None, 1, 2, 3, 4, 6, 8):
                check(plan_layout(nodes, wanted), nodes, wanted)
                checked += 1
    assert checked == 7 * sum(3**w for w in range(1, 7))


def test_examples() -> None:
    one_per_node = [f"n{i}" for i in range(4)]
    hsdp = plan_layout(one_per_node, 2)
    assert (hsdp.shards, hsdp.replicas, hsdp.wards) == (2, 2, None)
    assert hsdp.shard_group(3) == [2, 3] and hsdp.replica_group(3) == [1, 3]
    three = plan_layout(one_per_node[:3], 2)  # after a node loss: one group of 3, mirrored
    assert (three.shards, three.wards) == (3, mirrors(one_per_node[:3]))
    assert "would leave one replica group" in three.reason
    assert plan_layout(["a", "a", "b", "b"], 2).replicas == 2  # shard groups within nodes, replicas across
    crossed = plan_layout(["a", "b", "a", "b"], 2)  # shard 0's replicas would both be on a
    assert crossed.replicas == 1 and "the replicas of a shard share a node" in crossed.reason
    assert plan_layout(["a", "b", "c", "d", "e"], 1).replicas == 5  # groups of one rank: replication
    assert plan_layout(one_per_node, None).replicas == 1
