"""Train the character-level transformer on several processes; examples/README.md shows how to run it."""

import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from char_model import build, parse_args, save


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl" if args.device.type == "cuda" else "gloo")
    data, model, optimizer, scheduler = build(args)
    model = DDP(model)
    sampler = DistributedSampler(data, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.global_batch // dist.get_world_size(), sampler=sampler)
    for _, (x, y) in zip(range(args.steps), loader, strict=False):
        x, y = x.to(args.device), y.to(args.device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
    if args.save and dist.get_rank() == 0:
        save(model, args.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
