"""`bench overhead`'s optimizer-state fraction for sharded runs: what a rank holds against the full state."""

from __future__ import annotations

import torch

from slurm_elastic.showcase.bench.fsdploop import optimizer_bytes


def stepped(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return opt


def test_moments_count_and_step_counters_do_not() -> None:
    net = torch.nn.Linear(4, 3)  # 15 parameters: two float32 moments of each, 120 bytes
    assert optimizer_bytes(stepped(list(net.parameters()))) == (120, 120)


def test_a_mirror_adds_to_what_the_rank_holds_not_to_the_full_state() -> None:
    own = stepped(list(torch.nn.Linear(4, 3).parameters()))
    mirror = stepped(list(torch.nn.Linear(4, 3).parameters()))
    assert optimizer_bytes(own, mirror) == (240, 120)
    assert optimizer_bytes(own, None) == (120, 120)
