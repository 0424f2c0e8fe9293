"""The per-micro-batch seeding draws what torch.manual_seed would, without its per-call cost."""

from __future__ import annotations

import torch

from slurm_elastic.worker.rng import seed_torch


def test_seed_torch_gives_the_stream_of_torch_manual_seed() -> None:
    for seed in (0, 1, 2**40 + 7):
        torch.manual_seed(seed)
        expected = (torch.rand(5), torch.randn(3), torch.nn.functional.dropout(torch.ones(8), 0.5))
        torch.manual_seed(seed + 1)  # something else in between
        seed_torch(seed)
        got = (torch.rand(5), torch.randn(3), torch.nn.functional.dropout(torch.ones(8), 0.5))
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
