"""Carry out a recovery plan: every member ends holding the same committed training state.

Members exchange (committed step, fingerprint) in one allgather, derive the same plan from the pure
`plan_recovery`, and receivers take the state in chunks from several sources by point-to-point
transfers. The first source publishes the layout (JSON) in the generation's store namespace, so a
receiver can size its buffer before the bytes arrive. Nothing is read from disk on this path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

from slurm_elastic.decide.transfer import PeerState, RecoveryPlan, chunk_bounds, plan_recovery
from slurm_elastic.errors import JobFailed
from slurm_elastic.worker.checkpoints.state import Layout, Snapshot, layout_of, pack, unpack
from slurm_elastic.worker.membership.comm import Group, run_interruptibly
from slurm_elastic.worker.strategy import SyncResult


def _result(plan: RecoveryPlan, received: Snapshot | None, moved: int, started: float) -> SyncResult:
    elapsed = time.monotonic() - started
    return SyncResult(plan.target_step, plan.sources, plan.receivers, plan.reason, moved, elapsed, received)


def exchange_views(group: Group, committed_step: int, fp: tuple[float, float]) -> list[PeerState]:
    mine = torch.tensor([float(committed_step), fp[0], fp[1]], dtype=torch.float64, device=group.device)
    views = group.allgather(mine)
    return [PeerState(r, int(v[0].item()), (v[1].item(), v[2].item())) for r, v in enumerate(views)]


def synchronize(
    group: Group,
    store: Any,
    key_prefix: str,
    committed_step: int,
    fp: tuple[float, float],
    capture: Any,
    before_transfer: Callable[[], None] = lambda: None,
) -> SyncResult:
    """`capture()` returns this replica's Snapshot; called only when this rank is a source.
    `before_transfer()` runs on every member once a transfer is planned (fault injection's "transfer")."""
    started = time.monotonic()
    plan = plan_recovery(exchange_views(group, committed_step, fp))
    if plan.target_step < 0:
        raise JobFailed(f"cannot recover generation {group.generation}: {plan.reason}")
    if not plan.receivers:
        return _result(plan, None, 0, started)
    before_transfer()
    meta_key = f"{key_prefix}/g{group.generation}/state-meta"
    rank = group.rank
    if rank in plan.sources:
        snap = capture()
        layout = layout_of(snap.tensors)
        if rank == plan.sources[0]:
            # A store call can fail as a collective can: the generation was superseded (the store refuses
            # its keys) or the coordinator is gone. Either way this generation failed, not the user's code.
            published = json.dumps({"meta": snap.meta, "layout": layout.to_json()})
            run_interruptibly(lambda: store.set(meta_key, published), group.interrupt, "state layout")
        buf = pack(snap.tensors, layout, device=group.device)
        sends = []
        for s in plan.sends_from(rank):
            lo, hi = chunk_bounds(layout.total, plan.n_chunks, s.chunk)
            if hi > lo:
                sends.append((buf[lo:hi], s.dst, s.chunk))
        group.exchange(sends, [])
        return _result(plan, None, layout.total * len(plan.receivers), started)
    raw = run_interruptibly(lambda: store.get(meta_key), group.interrupt, "state layout")
    published = json.loads(raw)
    layout = Layout.from_json(published["layout"])
    buf = torch.empty(layout.total, dtype=torch.uint8, device=group.device)
    recvs = []
    for s in plan.sends_to(rank):
        lo, hi = chunk_bounds(layout.total, plan.n_chunks, s.chunk)
        if hi > lo:
            recvs.append((buf[lo:hi], s.src, s.chunk))
    group.exchange([], recvs)
    snap = Snapshot(published["meta"], unpack(buf.cpu(), layout))  # RNG states must be CPU tensors
    return _result(plan, snap, layout.total * len(plan.receivers), started)
