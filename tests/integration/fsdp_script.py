"""A small Llama-style model (examples/llama_model.py) sharded with fully_shard, trained under ElasticJob for
`--steps` steps of a fixed global batch (HSDP with `--shard-group N`); rank 0 writes the full model to
`--save`. `--pause S` sleeps after each step; SE_TEST_GATE="STEP:FILE" makes every rank wait before step STEP
until FILE exists (so that a test can let a restarted worker, which takes seconds to import torch, join at a
known step). Neither touches the math."""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

import slurm_elastic as se
from llama_model import Llama, Sequences


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=12)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--save", default="")
    p.add_argument("--shard-group", type=int, default=None, help="HSDP: shard over groups of this many ranks")
    args = p.parse_args()
    torch.manual_seed(0)
    model = Llama(vocab=64, dim=32, layers=2, heads=2)
    mesh = se.placeholder_mesh(shard_group=args.shard_group)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    data = Sequences(512, seq_len=16)
    job = se.ElasticJob(model, optimizer, dataset=data, global_batch=args.global_batch, micro_batch=args.micro_batch)
    gate = os.environ.get("SE_TEST_GATE", "0:").split(":", 1)
    for step in job.steps(args.steps):
        while step.number >= int(gate[0]) > 0 and not Path(gate[1]).exists():
            time.sleep(0.02)
        for x, y in step.micro_batches():
            step.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        time.sleep(args.pause)
    state = {name: value.full_tensor() for name, value in model.state_dict().items()}
    if args.save and job.rank == 0:
        torch.save(state, args.save)


if __name__ == "__main__":
    main()
