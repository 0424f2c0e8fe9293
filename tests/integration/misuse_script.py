"""A training script that leaves or misuses the loop in the way `--mode` names, for test_misuse.py (two
micro-batches per rank and step on two nodes).

break:    leaves `for batch in job.micro_batches(20)` inside step 4, after its first backward
leave:    every rank leaves that loop at step boundary 3 (a break before step 4's first backward)
disagree: rank 0 alone leaves it at step boundary 3
lengths:  rank 1 asks for one step more than rank 0
stop:     rank 0 calls job.stop() after step 2, and the loop of every rank ends at the next boundary
save_top: rank 0 saves at the top of a step of `for step in job.steps(6)`, before its first backward (allowed)
save_mid: rank 0 saves after step 3's first backward
outside:  calls job.backward(loss) between two epochs, outside any micro-batch
twice:    calls job.micro_batches(5) once per "epoch", as if total_steps counted one epoch's steps
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import slurm_elastic as se
from regression_data import RegressionData


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = ["break", "leave", "disagree", "lengths", "stop", "save_top", "save_mid", "outside", "twice"]
    parser.add_argument("--save-to", type=Path)
    parser.add_argument("--mode", choices=modes, required=True)
    args = parser.parse_args()
    mode = args.mode
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    job = se.ElasticJob(model, optimizer, dataset=RegressionData(96), micro_batch=8, global_batch=32)
    print(f"rank {job.rank} of {job.world_size}", flush=True)
    if mode == "break":
        for i, (x, y) in enumerate(job.micro_batches(20)):
            job.backward(F.mse_loss(model(x), y))
            if i == 6:
                break
        print("after the loop", flush=True)
    elif mode in ("leave", "disagree", "lengths", "stop"):
        leaves = mode == "leave" or (mode == "disagree" and job.rank == 0)
        for x, y in job.micro_batches(20 + (mode == "lengths" and job.rank == 1)):
            if leaves and job.step == 3:
                break
            job.backward(F.mse_loss(model(x), y))
            if mode == "stop" and job.rank == 0 and job.step == 2:
                job.stop("enough for this test")
        print(f"after the loop at step {job.step}, rank {job.rank} of {job.world_size}", flush=True)
    elif mode == "save_top":
        for step in job.steps(6):
            if job.rank == 0 and job.step == 3:
                job.save(args.save_to)
            for x, y in step.micro_batches():
                step.backward(F.mse_loss(model(x), y))
        print(f"after the loop at step {job.step}", flush=True)
    elif mode == "save_mid":
        for x, y in job.micro_batches(6):
            job.backward(F.mse_loss(model(x), y))
            if job.rank == 0 and job.step == 2:
                job.save(args.save_to)
    elif mode == "outside":
        for _ in job.epochs(3):
            for x, y in job.micro_batches():
                loss = F.mse_loss(model(x), y)
                job.backward(loss)
            job.backward(loss)
    else:
        for _ in range(2):
            for x, y in job.micro_batches(5):
                job.backward(F.mse_loss(model(x), y))


if __name__ == "__main__":
    main()
