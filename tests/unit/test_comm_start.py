"""A collective that fails as it starts (gloo raises at once when a peer's connection already closed, as on a
node whose tasks were all SIGKILLed) is a failed collective that a recovery handles, not an error of the
user's code that ends the worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from slurm_elastic.worker.membership.comm import CollectiveFailed, Group, Interrupt

REFUSAL = "Connection closed by peer [127.0.0.1]:29573"


class RefusingGroup:
    """The process group of a generation whose peer died: every collective raises as it starts."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any) -> Any:
            self.started.append(name)
            raise RuntimeError(REFUSAL)

        return refuse


def t() -> torch.Tensor:
    return torch.zeros(4)


CALLS: dict[str, Callable[[Group], object]] = {
    "allreduce_": lambda g: g.allreduce_(t()),
    "launch_allreduce": lambda g: g.launch_allreduce(t()),
    "allgather": lambda g: g.allgather(t()),
    "launch_all_gather": lambda g: g.launch_all_gather(torch.zeros(8), t()),
    "launch_reduce_scatter": lambda g: g.launch_reduce_scatter(torch.zeros(2), t()),
    "exchange (send)": lambda g: g.exchange([(t(), 1, 8)], [(t(), 1, 8)]),
    "exchange (recv)": lambda g: g.exchange([], [(t(), 1, 8)]),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_collective_refused_as_it_starts_is_a_failed_collective(call: Callable[[Group], object]) -> None:
    pg = RefusingGroup()
    group = Group(pg, 0, 2, 1, Interrupt())
    with pytest.raises(CollectiveFailed, match=r"could not start: Connection closed by peer") as raised:
        call(group)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert len(pg.started) == 1, pg.started  # nothing else was started after the refusal
