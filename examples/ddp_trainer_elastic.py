"""A Trainer in the style of the usual multi-node DDP tutorials: an epoch loop over a DataLoader with a
DistributedSampler, and a snapshot (model and epochs run) saved every few epochs and loaded at start.

    torchrun --nproc-per-node 2 examples/ddp_trainer_plain.py --epochs 6 --save-every 2    # plain DDP
    slurm-elastic run --local --nodes 2 -- python examples/ddp_trainer_elastic.py --epochs 6 --save-every 2

`ddp_trainer_elastic.py` is the same script made elastic; `diff` the two files to see every changed line.
There the job steps the optimizer once per global batch: inside its loop `optimizer.zero_grad()` and
`optimizer.step()` do nothing, and the snapshot holds the whole state (optimizer, data position, RNG).
"""

import argparse
import os

import torch
import torch.nn.functional as F

import slurm_elastic as se
from regression_data import RegressionData


def load_train_objs(args: argparse.Namespace) -> tuple[RegressionData, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return RegressionData(args.samples), model, optimizer


def prepare_dataloader(dataset: RegressionData, batch_size: int):
    return se.ElasticLoader(dataset, batch_size=batch_size, pin_memory=True, shuffle=True)


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every: int, snapshot_path: str) -> None:
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.job = se.ElasticJob(model, optimizer, loader=train_data, resume_from=snapshot_path)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> float:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        self.job.backward(loss)
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch: int) -> None:
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        print(f"[local rank {self.local_rank}] epoch {epoch} | batches {len(self.train_data)} | loss {loss:.4f}")

    def _save_snapshot(self, epoch: int) -> None:
        self.job.save(self.snapshot_path)
        print(f"Epoch {epoch} | training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int) -> None:
        for epoch in self.job.epochs(max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="train a small regression model on several processes")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2, help="epochs between snapshots")
    p.add_argument("--snapshot", default="snapshot.pt", help="loaded at start when it exists")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dataset, model, optimizer = load_train_objs(args)
    train_data = prepare_dataloader(dataset, args.batch_size)
    trainer = Trainer(model, train_data, optimizer, args.save_every, args.snapshot)
    trainer.train(args.epochs)


if __name__ == "__main__":
    main()
