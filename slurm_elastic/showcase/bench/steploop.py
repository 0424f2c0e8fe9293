"""The training loop `bench overhead` times: one char-LM workload, run by plain torch DDP (under torchrun)
or by ElasticJob (under the local launcher), so that the two differ only in what runs the step.

Both load batches of `micro_batch` samples, accumulate `global_batch / (world * micro_batch)` of them
per rank and step (DDP under `no_sync` but for the last, as a DDP user writes it), and record the time
each step starts on every rank and the rank's peak resident memory, into `<out>/rank<R>.json`.

    python -m slurm_elastic.showcase.bench.steploop --mode ddp|elastic --data DIR --out DIR --steps N --dim D --layers L

`--mode fsdp|elastic_fsdp`: the same with the model sharded by FSDP2 (`fsdploop.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from slurm_elastic.showcase.bench import charlm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m slurm_elastic.showcase.bench.steploop", description=__doc__)
    p.add_argument("--mode", choices=("ddp", "elastic", "fsdp", "elastic_fsdp"), required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    return p.parse_args(argv)


def run_ddp(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from slurm_elastic.data import TokenDataset

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = TokenDataset(args.data, args.seq_len)
    model = DDP(charlm.model(args, data.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accumulate = max(1, args.global_batch // (world * args.micro_batch))
    loader = iter(DataLoader(data, batch_size=args.micro_batch, sampler=DistributedSampler(data, seed=0)))
    starts: list[float] = []
    for _ in range(args.steps):
        starts.append(time.time())
        for i in range(accumulate):
            x, y = next(loader)
            with model.no_sync() if i < accumulate - 1 else contextlib.nullcontext():
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()) / accumulate
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    starts.append(time.time())
    params = sum(p.numel() for p in model.parameters())
    charlm.report(Path(args.out), rank, starts, params)
    dist.destroy_process_group()


def run_elastic(args: argparse.Namespace) -> None:
    import slurm_elastic as se
    from slurm_elastic.data import TokenDataset

    data = TokenDataset(args.data, args.seq_len)
    model = charlm.model(args, data.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = se.ElasticJob(model, optimizer, dataset=data, global_batch=args.global_batch, micro_batch=args.micro_batch)
    starts: list[float] = []
    for step in job.steps(args.steps):
        starts.append(time.time())
        for x, y in step.micro_batches():
            step.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    starts.append(time.time())
    params = sum(p.numel() for p in model.parameters())
    charlm.report(Path(args.out), job.rank, starts, params)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.mode in ("fsdp", "elastic_fsdp"):
        from slurm_elastic.showcase.bench.fsdploop import run_elastic_fsdp, run_fsdp

        (run_fsdp if args.mode == "fsdp" else run_elastic_fsdp)(args)
        return
    (run_ddp if args.mode == "ddp" else run_elastic)(args)


if __name__ == "__main__":
    main()
