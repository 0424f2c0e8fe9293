"""The elastic example's training, with a pause after each step (`--pause S`), so that a node that takes
seconds to start (importing torch) arrives while the job still runs. The pause does not touch the math."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch.nn.functional as F

import slurm_elastic as se
from char_model import build, parse_args, save


def main() -> None:
    pause = float(sys.argv.pop(sys.argv.index("--pause") + 1)) if "--pause" in sys.argv else 0.0
    if "--pause" in sys.argv:
        sys.argv.remove("--pause")
    args = parse_args()
    data, model, optimizer, scheduler = build(args)
    job = se.ElasticJob(
        model, optimizer, scheduler, dataset=data, global_batch=args.global_batch, micro_batch=args.micro_batch
    )
    for step in job.steps(args.steps):
        for x, y in step.micro_batches():
            step.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        time.sleep(pause)
    if args.save and job.rank == 0:
        save(model, args.save)


if __name__ == "__main__":
    main()
