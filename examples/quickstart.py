"""Quickstart: a complete elastic training script; README.md shows how to run it and what it prints."""

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import slurm_elastic as se

torch.manual_seed(0)  # the same data and initial model on every rank
x = torch.randn(4096, 20)
data = TensorDataset(x, x @ torch.randn(20, 1) + 0.1 * torch.randn(4096, 1))
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

job = se.ElasticJob(
    model,
    optimizer,
    dataset=data,
    global_batch=64,  # samples per optimizer step, whatever the number of ranks
    micro_batch=16,  # the unit of work a rank computes at a time
    extra_state={"best": float("inf")},  # your own state travels with the model's
    resume_from="quickstart.pt",  # loaded at the start if it exists
)
print(f"rank {job.rank} of {job.world_size}, starting in epoch {job.epoch}")  # the first use joins the job

for epoch in job.epochs(5):
    for x, y in job.micro_batches():  # this rank's share of each step of this epoch
        job.backward(F.mse_loss(model(x), y))  # the job sums over the ranks, steps the optimizer, commits
    job.extra_state["best"] = min(job.extra_state["best"], job.loss)
    if job.rank == 0:
        print(f"epoch {epoch}: loss {job.loss:.4f} (best {job.extra_state['best']:.4f}), world {job.world_size}")
        job.save("quickstart.pt")  # the whole state: a new run resumes from here
