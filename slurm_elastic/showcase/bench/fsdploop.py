"""The FSDP2 loops `bench overhead` times (`steploop.py --mode fsdp|elastic_fsdp`): the same char-LM workload,
each transformer block and the root sharded with `fully_shard`, run by plain FSDP2 under torchrun or by
ElasticJob (which keeps a mirror of one other rank's shard, docs/fsdp.md).

Both reduce-scatter after every micro-batch's backward (FSDP2's default; the elastic job does so too), so
they differ only in what runs the step. Each rank also records the bytes of optimizer state it holds
(AdamW's moments: its own shard, plus the mirrored shard in the elastic job) and the full state's bytes.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from slurm_elastic.showcase.bench import charlm


def _shard(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    # The char-LM's head returns a view (a Linear over 3-D input); nothing here changes it in place, so
    # FSDP2's warning about in-place ops on a view would only fill every rank's log, in both loops alike.
    warnings.filterwarnings("ignore", message=r".*returned a view tensor", category=UserWarning)
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def optimizer_bytes(*optimizers: torch.optim.Optimizer | None) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the full state) of the optimizers' tensors shaped like parameters."""
    held = full = 0
    for i, opt in enumerate(optimizers):
        if opt is None:
            continue
        for per in opt.state.values():
            for value in per.values():
                if not isinstance(value, torch.Tensor) or value.numel() <= 1:
                    continue  # step counters
                local = value._local_tensor if isinstance(value, DTensor) else value
                held += local.numel() * local.element_size()
                if i == 0:  # the full state is the user's optimizer's (a mirror adds bytes, not state)
                    full += value.numel() * value.element_size()
    return held, full


def run_fsdp(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader, DistributedSampler

    from slurm_elastic.data import TokenDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = TokenDataset(args.data, args.seq_len)
    model = charlm.model(args, data.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    _shard(model, init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accumulate = max(1, args.global_batch // (world * args.micro_batch))
    loader = iter(DataLoader(data, batch_size=args.micro_batch, sampler=DistributedSampler(data, seed=0)))
    starts: list[float] = []
    for _ in range(args.steps):
        starts.append(time.time())
        for _ in range(accumulate):
            x, y = next(loader)
            (F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
    starts.append(time.time())
    charlm.report(Path(args.out), rank, starts, params, optimizer_bytes(optimizer))
    dist.destroy_process_group()


def run_elastic_fsdp(args: argparse.Namespace) -> None:
    import slurm_elastic as se
    from slurm_elastic.data import TokenDataset

    data = TokenDataset(args.data, args.seq_len)
    model = charlm.model(args, data.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    _shard(model, se.placeholder_mesh())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = se.ElasticJob(model, optimizer, dataset=data, global_batch=args.global_batch, micro_batch=args.micro_batch)
    starts: list[float] = []
    for step in job.steps(args.steps):
        starts.append(time.time())
        for x, y in step.micro_batches():
            step.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    starts.append(time.time())
    mirror = getattr(job._held, "mirror_opt", None)  # the second holder's optimizer over the mirrored shard
    charlm.report(Path(args.out), job.rank, starts, params, optimizer_bytes(optimizer, mirror))
