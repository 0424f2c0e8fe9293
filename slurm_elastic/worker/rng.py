"""Seeding torch's random generators once per micro-batch, at a cost that does not show in a step."""

from __future__ import annotations

import torch


def seed_torch(seed: int) -> None:
    """What `torch.manual_seed(seed)` does for the CPU and CUDA generators. `torch.manual_seed` also queues
    the seed for every other accelerator type that is not initialized, capturing a stack trace each time:
    0.25 ms a call on these machines, paid for every micro-batch."""
    cuda = torch.cuda.is_available()
    if cuda and not torch.cuda.is_initialized():
        torch.manual_seed(seed)  # CUDA may start later: let torch queue the seed for it
        return
    torch.default_generator.manual_seed(seed)
    if cuda:
        torch.cuda.manual_seed_all(seed)
