"""A script whose own helpers ask torch.distributed, as DDP scripts' utilities do: `dist.get_rank()` picks
the rank that saves its own checkpoint (a plain `torch.save` of state dicts), `dist.all_reduce` sums a
metric of its own, and `dist.get_world_size()` is checked against the job's, at every step, through a kill
and a join. With `--gates STEP:FILE,...`, every rank waits before step STEP until FILE exists (saying
`at gate STEP`).

It prints one line per step, `world STEP RANK WORLD DIST_RANK DIST_WORLD METRIC`, and saves
`{"model", "optimizer", "step"}` to `--save` every 5 steps and after the loop (from rank 0 by
`dist.get_rank()`); `--load` it, if present, before training.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import slurm_elastic as se
from regression_data import RegressionData


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save", type=Path, required=True)
    parser.add_argument("--gates", default="")
    args = parser.parse_args()
    gates = [(int(step), Path(path)) for step, path in (g.split(":", 1) for g in args.gates.split(",") if g)]
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    job = se.ElasticJob(model, optimizer, dataset=RegressionData(480), micro_batch=4, global_batch=24)

    def save() -> None:
        if dist.get_rank() == 0:  # the script's own "master process", asked of torch
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": job.step}
            torch.save(state, args.save)

    @job.on_step
    def report(step: int, loss: float) -> None:
        metric = torch.tensor([1.0])
        dist.all_reduce(metric)  # a collective of the script's own, on torch's default group
        print(f"world {step} {job.rank} {job.world_size} {dist.get_rank()} {dist.get_world_size()} {metric.item():g}",
              flush=True)  # fmt: skip
        if step % 5 == 0:
            save()

    for x, y in job.micro_batches(args.steps):
        for step, gate in gates:
            if job.step + 1 >= step and not gate.exists():
                print(f"at gate {step}", flush=True)  # out of every collective: a peer may die now
            while job.step + 1 >= step and not gate.exists():
                time.sleep(0.02)
        job.backward(F.mse_loss(model(x), y))
    save()
    print(f"after the loop: default group {dist.get_rank()} of {dist.get_world_size()}", flush=True)


if __name__ == "__main__":
    main()
