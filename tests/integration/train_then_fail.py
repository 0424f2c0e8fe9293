"""Trains a few steps of the elastic example, then rank 1 fails after training (as a script that crashes
while saving): the job's training finished, but `slurm-elastic run` must not report success."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch.nn.functional as F

import slurm_elastic as se
from char_model import build, parse_args


def main() -> None:
    args = parse_args()
    data, model, optimizer, scheduler = build(args)
    job = se.ElasticJob(model, optimizer, scheduler, dataset=data, global_batch=32, micro_batch=8)
    for x, y in job.micro_batches(args.steps):
        job.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    if job.rank == 1:
        raise RuntimeError("disk quota exceeded while saving the model")


if __name__ == "__main__":
    main()
