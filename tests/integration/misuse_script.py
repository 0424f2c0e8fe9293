"""A training script that misuses the loop in the way `--mode` names, for test_misuse.py.

break:   leaves `for batch in job.micro_batches(20)` with a break at step 4, then ends normally
outside: calls job.backward(loss) between two epochs, outside any micro-batch
twice:   calls job.micro_batches(5) once per "epoch", as if total_steps counted one epoch's steps
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
    parser.add_argument("--mode", choices=["break", "outside", "twice"], required=True)
    mode = parser.parse_args().mode
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    job = se.ElasticJob(model, torch.optim.SGD(model.parameters(), lr=0.01), dataset=RegressionData(96), micro_batch=8)
    print(f"rank {job.rank} of {job.world_size}", flush=True)
    if mode == "break":
        for x, y in job.micro_batches(20):
            if job.step == 3:
                break
            job.backward(F.mse_loss(model(x), y))
        print("after the loop", flush=True)
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
