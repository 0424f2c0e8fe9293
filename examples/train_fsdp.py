"""Train a small Llama-style model sharded with FSDP2 (`fully_shard`), in the usual torchrun style.

    torchrun --nproc-per-node 2 examples/train_fsdp.py --epochs 2                               # plain FSDP2
    slurm-elastic run --local --nodes 2 -- python examples/train_fsdp_elastic.py --epochs 2     # elastic

`train_fsdp_elastic.py` is the same script made elastic; `diff` the two files to see every changed line.
There every parameter and optimizer shard is held twice (on two nodes), a lost node's shards are re-sharded
from peers to the new world size, and the global batch stays the same (docs/fsdp.md).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from llama_model import Llama, Sequences


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="train a small Llama-style model with FSDP2")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default="", help="rank 0 writes the trained model's full state dict here")
    p.add_argument("--shard-group", type=int, default=None, help="HSDP: shard over groups of this many ranks")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    world, group = dist.get_world_size(), args.shard_group
    mesh = init_device_mesh("cpu", (world // group, group) if group else (world,))  # 2-D: HSDP
    torch.manual_seed(args.seed)
    model = Llama(vocab=64, dim=args.dim, layers=args.layers, heads=4)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = Sequences(args.samples, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, seed=args.seed))

    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch} | loss {loss.item():.4f}", flush=True)

    state = {name: value.full_tensor() for name, value in model.state_dict().items()}  # every rank gathers
    rank = dist.get_rank()
    if rank == 0 and args.save:
        torch.save(state, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
