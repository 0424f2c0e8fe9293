"""Bring a sharded (FSDP2) generation in sync: every member ends holding its own shard and its ward's, of the
new world size, at the same committed step, taken from peers' memory and never from disk.

1. Every member reports what it holds (one allgather of a few numbers each) and derives the same
   `decide.heal` plan: the target step, who finishes it first, which copies may serve.
2. The source (the lowest-ranked member at the target) publishes the list of sharded tensors and the
   small replicated state (progress, optimizer counters and hyperparameters, scheduler) in the store.
3. `decide.reshard` plans who sends which rows to whom; `transfer.execute` moves them with checksums;
   a refused sender's copies are dropped and the rows planned again from the other holders.
4. The model is moved onto the generation's mesh with its new rows, and the mirror rebuilt.

Rows that no live, trusted holder has raise `StateLost`: the job must resume from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo

from slurm_elastic.decide.heal import HealPlan, ShardReport, plan_heal
from slurm_elastic.decide.reshard import Holding, Need, ReshardPlan, plan_reshard, shard_rows
from slurm_elastic.decide.shardlayout import Layout, plan_layout
from slurm_elastic.errors import ElasticError, StateLost
from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoints.ckptfiles import CheckpointError
from slurm_elastic.worker.membership.comm import Group, run_interruptibly
from slurm_elastic.worker.sharded.checkpoint import complete_checkpoints, load_shard, read_small
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.sharded.mesh import generation_mesh
from slurm_elastic.worker.sharded.remesh import Entry, rebind
from slurm_elastic.worker.sharded.transfer import execute
from slurm_elastic.worker.strategy import SyncResult

log = get_logger("slurm_elastic.worker")
ROUNDS = 3  # transfer rounds before giving up on refused senders
SPLIT_BYTES = 1 << 20


def node_of(worker_id: str) -> str:
    return worker_id.rsplit(":", 2)[0]


def _report(group: Group, replica: ShardedReplica) -> tuple[list[ShardReport], list[tuple[int, int]]]:
    replica.learn_keys()  # the moments of an optimizer state the script loaded are held (and digested) too
    own_ok, mirror_ok = replica.self_check()
    digests = replica.take_digests() if replica.fresh else replica.digests  # fresh: the script's initial model
    pending = replica.pending
    prepared = pending is not None and pending.step == replica.step + 1 and not replica.fresh
    mine = torch.tensor(
        [
            replica.committed_step,
            float(prepared),
            replica.world,
            replica.index,
            replica.ward,
            float(own_ok),
            float(mirror_ok),
            digests[0],
            digests[1],
            replica.last_norm2,
            replica.last_lr_factor,
            *_newest_checkpoint(replica),
        ],
        dtype=torch.float64,
    )
    views = group.allgather(mine)
    checkpoints = [(int(v[11].item()), int(v[12].item())) for v in views]
    return [
        ShardReport(
            rank,
            int(v[0]),
            bool(v[1]),
            int(v[2]),
            int(v[3]),
            int(v[4]),
            bool(v[5]),
            bool(v[6]),
            int(v[7]),
            int(v[8]),
            float(v[9]),
            float(v[10]),
        )
        for rank, v in enumerate(v.tolist() for v in views)
    ], checkpoints


def _newest_checkpoint(replica: ShardedReplica) -> tuple[int, int]:
    """(step, world) of the newest complete checkpoint a fresh start would load, or (-1, 0)."""
    if replica.checkpoint_dir is None or not replica.fresh:
        return -1, 0
    found = complete_checkpoints(replica.checkpoint_dir)
    return found[-1] if found else (-1, 0)


def synchronize_sharded(
    replica: ShardedReplica,
    group: Group,
    store: Any,
    key_prefix: str,
    members: list[str],
    before_transfer: Callable[[], None] = lambda: None,
) -> SyncResult:
    started = time.monotonic()
    me, world = group.rank, group.world
    reports, checkpoints = _report(group, replica)
    heal = plan_heal(reports)
    layout = plan_layout([node_of(w) for w in members], replica.shard_group_wanted)
    needs, wards = layout.needs([str(r) for r in range(world)]), layout.wards
    if heal.fresh and checkpoints[heal.source][0] >= 0:
        return _from_checkpoint(replica, group, store, key_prefix, checkpoints[heal.source], layout, started)
    if me in heal.roll_forward:  # progress (cursor, scheduler) comes from the source below
        replica.commit(heal.target_step, 0, heal.norm2, replica.clip, heal.lr_factor)
    for line in heal.refused:
        _refused(replica, group, heal.source, line)
    entries, small = _layout(replica, group, store, key_prefix, heal)
    mine = {"primary": (layout.shards, layout.index(me))}
    if wards is not None:
        mine["mirror"] = (layout.shards, wards[me])
    before_transfer()  # fault injection's "transfer" phase
    got, plan, moved = _move(replica, group, entries, list(heal.holdings), needs, mine, heal.target_step, heal.refused)
    _install(replica, group, store, key_prefix, entries, small, got, layout)
    senders = tuple(sorted({int(p.src) for p in plan.pieces if not p.local}))
    receivers = tuple(sorted({int(p.dst) for p in plan.pieces if not p.local}))
    reason = f"{heal.reason}; {plan.reason}; {layout.reason}"
    return SyncResult(heal.target_step, senders, receivers, reason, moved, time.monotonic() - started)


def _refused(replica: ShardedReplica, group: Group, source: int, line: str) -> None:
    log.warning("shard_refused", generation=group.generation, rank=group.rank, detail=line)
    if replica.on_refused is not None and group.rank == source:
        replica.on_refused(line)


def _move(
    replica: ShardedReplica,
    group: Group,
    entries: list[Entry],
    holdings: list[Holding],
    needs: list[Need],
    mine: dict[str, tuple[int, int]],
    step: int,
    refused: tuple[str, ...] = (),
) -> tuple[dict[tuple[str, int], torch.Tensor], ReshardPlan, int]:
    """Plan and carry out the transfers; a refused sender's copies are dropped and the rows planned again."""
    me = group.rank
    excluded: set[str] = set()
    moved = 0
    for round_ in range(ROUNDS):
        usable = [h for h in holdings if h.holder not in excluded]
        plan = plan_reshard(
            [e.rows for e in entries], [e.row_bytes for e in entries], usable, needs, split_bytes=SPLIT_BYTES
        )
        if not plan.complete:
            why = "; ".join((plan.reason, *refused))
            raise StateLost(f"generation {group.generation}, step {step}: {why}")
        copies = {role: c for role, c in replica.copies().items() if Holding(str(me), c[0], c[1]) in usable}
        got = execute(group, plan, entries, copies, mine, step, round_=round_, tamper=replica.phases.sending())
        moved += plan.bytes_moved  # every rank's sends: each rank planned the same
        if not got.refused_from:
            return got.rows, plan, moved
        excluded |= {str(r) for r in got.refused_from}
        line = f"data from ranks {sorted(got.refused_from)} failed its checksum or step; taken again from other holders"
        _refused(replica, group, 0, line)
    raise StateLost(f"generation {group.generation}: transfers refused in {ROUNDS} rounds")


def _from_checkpoint(
    replica: ShardedReplica,
    group: Group,
    store: Any,
    key_prefix: str,
    found: tuple[int, int],
    layout: Layout,
    started: float,
) -> SyncResult:
    """A fresh start with a checkpoint: each rank reads its new shard from disk, then mirrors from peers."""
    step, world = found
    assert replica.checkpoint_dir is not None
    small = read_small(replica.checkpoint_dir, step)
    replica.keys = {fqn: list(keys) for fqn, keys in small["keys"].items()}
    entries = [
        Entry(fqn, key, tuple(fp._orig_size), fp.sharded_param.dtype)
        for fqn, fp in replica.params.items()
        for key in ["param", *replica.keys.get(fqn, [])]
    ]
    me = group.rank
    zeros = {
        ("primary", t): torch.zeros((hi - lo, *e.shape[1:]), dtype=e.dtype)
        for t, e in enumerate(entries)
        for lo, hi in [shard_rows(e.rows, layout.shards, layout.index(me))]
    }
    wards = layout.wards
    _install(replica, group, store, key_prefix, entries, small, zeros, dataclasses.replace(layout, wards=None))
    small = load_shard(replica.checkpoint_dir, step, world, replica)
    try:
        replica.set_small_state(small)
    except (ElasticError, KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        where = replica.checkpoint_dir / f"step-{step:09d}"
        raise CheckpointError(f"{where} does not fit this job's model or optimizer: {str(exc)[:300]}") from None
    replica.seal()  # what the mirrors below are checked against if this is interrupted
    moved = 0  # the mirrors' bytes: the shards themselves came from disk
    if wards is not None:
        holdings = [Holding(str(r), layout.shards, layout.index(r)) for r in range(group.world)]
        members = [str(r) for r in range(group.world)]
        mirror_needs = [n for n in layout.needs(members) if n.role == "mirror"]
        mine = {"mirror": (layout.shards, wards[me])}
        rows, _, moved = _move(replica, group, entries, holdings, mirror_needs, mine, step)
        replica.set_mirror(wards[me], {(e.fqn, e.key): rows[("mirror", t)] for t, e in enumerate(entries)})
        replica.wards, replica.layout = wards, layout
    replica.seal()
    log.info("resumed_from_checkpoint", step=step, saved_world=world, world=group.world, rank=group.rank)
    reason = f"fresh start from the sharded checkpoint of step {step} (saved by {world} ranks)"
    return SyncResult(step, (), (), reason, moved, time.monotonic() - started)


def _layout(
    replica: ShardedReplica, group: Group, store: Any, key_prefix: str, heal: HealPlan
) -> tuple[list[Entry], dict[str, Any]]:
    key = f"{key_prefix}/g{group.generation}/sharded-layout"
    if group.rank == heal.source:  # a failed store call fails the generation, as in the replicated sync
        published = json.dumps({"entries": [e.to_json() for e in replica.entries()], "small": replica.small_state()})
        run_interruptibly(lambda: store.set(key, published), group.interrupt, "sharded state layout")
    layout = json.loads(run_interruptibly(lambda: store.get(key), group.interrupt, "sharded state layout"))
    return [Entry.from_json(e) for e in layout["entries"]], layout["small"]


def _install(
    replica: ShardedReplica,
    group: Group,
    store: Any,
    key_prefix: str,
    entries: list[Entry],
    small: dict[str, Any],
    rows: dict[tuple[str, int], torch.Tensor],
    layout: Layout,
) -> None:
    """Move the model onto the generation's mesh (its shard group's) with its new rows; hold the mirrored
    shard. The shard group is formed before the replica group on every rank: no two ranks wait on each other."""
    me, wards = group.rank, layout.wards
    shards = group.split(store, key_prefix, layout.shard_group(me), f"shards-{layout.replica(me)}")
    replicas = group.split(store, key_prefix, layout.replica_group(me), f"replicas-{layout.index(me)}")
    gm = generation_mesh(shards.pg, shards.rank, shards.world, f"g{group.generation}r{group.rank}")
    replica.keys = {fqn: list(keys) for fqn, keys in small["keys"].items()}
    own = {(e.fqn, e.key): rows[("primary", t)] for t, e in enumerate(entries)}
    rebind(replica.model, replica.optimizer, lambda: FSDPMeshInfo(gm.mesh, shard_mesh_dim=0), own)
    ward = wards[me] if wards is not None else -1
    replica.set_small_state(small)
    mirror = {(e.fqn, e.key): rows[("mirror", t)] for t, e in enumerate(entries)} if ward >= 0 else {}
    replica.set_mirror(ward, mirror)
    if replica.mesh is not None:
        replica.mesh.close()
    replica.mesh = gm
    replica.world, replica.index, replica.wards = layout.shards, layout.index(me), wards
    replica.layout, replica.shards, replica.replicas = layout, shards, replicas
    replica.pending = None
    replica.seal()


__all__ = ["StateLost", "node_of", "synchronize_sharded"]
