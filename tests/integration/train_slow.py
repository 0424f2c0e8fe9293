"""The elastic example's training, with a pause after each step (`--pause S`), so that a node that takes
seconds to start (importing torch) arrives while the job still runs, a hold (`--hold-file PATH`: no
step starts while PATH exists) that `slurm-elastic chaos` uses to let a joiner arrive before the job goes
on, and a bound (`--until-file PATH`: no step numbered above the integer in PATH starts) with which
`chaos --slurm` leads the job from fault to fault, and a pace (`--pause-file PATH`: a number in PATH
replaces `--pause`) with which a test speeds the job to its end once it has seen what it waits for. None
touches the math."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch.nn.functional as F

import slurm_elastic as se
from char_model import build, parse_args, save


def option(name: str, default: str | None) -> str | None:
    """Take `name VALUE` out of the command line (the example's own parser does not know it)."""
    if name not in sys.argv:
        return default
    i = sys.argv.index(name)
    value = sys.argv[i + 1]
    del sys.argv[i : i + 2]
    return value


def bound(path: str) -> float:
    try:
        with open(path) as fh:
            return int(fh.read())
    except (OSError, ValueError):  # no bound (yet), or being replaced
        return float("inf")


def pace(default: float, path: str | None) -> float:
    if path is None:
        return default
    try:
        with open(path) as fh:
            return float(fh.read())
    except (OSError, ValueError):  # no pace file (yet)
        return default


def main() -> None:
    pause = float(option("--pause", "0") or 0)
    pause_file = option("--pause-file", None)
    hold = option("--hold-file", None)
    until = option("--until-file", None)
    per_replica = option("--per-replica-batch", None)
    lr_rule = option("--lr-rule", "linear")
    args = parse_args()
    data, model, optimizer, scheduler = build(args)
    batch = {"per_replica_batch": int(per_replica)} if per_replica else {"global_batch": args.global_batch}
    job = se.ElasticJob(
        model,
        optimizer,
        scheduler,
        dataset=data,
        micro_batch=args.micro_batch,
        lr_rule=lr_rule,
        **batch,  # type: ignore[arg-type]
    )
    for step in job.steps(args.steps):
        while (hold and os.path.exists(hold)) or (until and step.number > bound(until)):
            time.sleep(0.05)
        for x, y in step.micro_batches():
            step.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        time.sleep(pace(pause, pause_file))
    if args.save and job.rank == 0:
        save(model, args.save)


if __name__ == "__main__":
    main()
