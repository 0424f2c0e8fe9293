"""Train the character-level transformer on several processes; examples/README.md shows how to run it."""

import torch.nn.functional as F

import slurm_elastic as se
from char_model import build, parse_args, save


def main() -> None:
    args = parse_args()
    data, model, optimizer, scheduler = build(args)
    job = se.ElasticJob(model, optimizer, scheduler, dataset=data, global_batch=args.global_batch, micro_batch=args.micro_batch, seed=args.seed)  # fmt: skip # noqa: E501
    for x, y in job.micro_batches(args.steps):
        x, y = x.to(args.device), y.to(args.device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        job.backward(loss)
    if args.save and job.rank == 0:
        save(model, args.save)


if __name__ == "__main__":
    main()
