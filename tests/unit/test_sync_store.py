"""A store call that fails while the state is handed over fails the generation (the rank tries the next),
never the worker: seen under chaos, where a source published the state's layout under a generation the
store had already retired, and the rank died as if the user's code had raised."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from slurm_elastic.worker.checkpoints.state import Snapshot
from slurm_elastic.worker.membership.comm import CollectiveFailed, Interrupt
from slurm_elastic.worker.replicated.sync import synchronize


class SourceGroup:
    """Rank 0 of two, a step ahead of rank 1: it is the source of the transfer."""

    rank, generation, device = 0, 6, torch.device("cpu")

    def __init__(self) -> None:
        self.interrupt = Interrupt()
        self.sent: list[Any] = []

    def allgather(self, mine: torch.Tensor) -> list[torch.Tensor]:
        behind = torch.tensor([mine[0].item() - 1, 0.0, 0.0], dtype=torch.float64)
        return [mine, behind]

    def exchange(self, sends: list[Any], recvs: list[Any]) -> None:
        self.sent += sends


class RetiredStore:
    def set(self, key: str, value: str) -> None:
        raise dist.DistStoreError(f"store key {key!r} belongs to generation 6, which is over")


def test_a_store_that_refuses_the_layout_fails_the_generation_not_the_worker() -> None:
    snapshot = Snapshot({"step": 5, "w": {"__t__": 0}}, [torch.ones(3)])
    with pytest.raises(CollectiveFailed, match=r"state layout: .*which is over"):
        synchronize(SourceGroup(), RetiredStore(), "rdzv", 5, (1.0, 2.0), lambda: snapshot)  # type: ignore[arg-type]
