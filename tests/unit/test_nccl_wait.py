"""How a rank waits for an NCCL collective. NCCL's future completes once the collective is queued on the GPU,
and on an H200 a rank whose peer died then blocked for good in the next host sync (`.item()`), deaf to the new
generation. So an NCCL group polls the work's own completion and hears the interrupt; gloo's keeps waiting
on the future. The works here are doubles with NCCL's interface (is_completed, wait, get_future)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from slurm_elastic.worker.membership.comm import CollectiveFailed, Group, Interrupt, Interrupted


class QueuedWork:
    """An NCCL work: its future is done at once; it ends after `polls` checks, or never (None)."""

    def __init__(self, polls: int | None, error: str | None = None) -> None:
        self.polls, self.error = polls, error
        self.checked = 0
        self.waited = 0

    def is_completed(self) -> bool:
        self.checked += 1
        return self.polls is not None and self.checked > self.polls

    def wait(self) -> bool:
        self.waited += 1
        if self.error:
            raise RuntimeError(self.error)
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(None)  # as NCCL's: complete when queued, whatever the GPU still does
        return future


class OneCollective:
    def __init__(self, work: QueuedWork, name: str) -> None:
        self.work, self._name = work, name

    def allreduce(self, tensors: list[torch.Tensor]) -> Any:
        return self.work

    def name(self) -> str:
        return self._name


def group_over(work: QueuedWork, backend: str, interrupt: Interrupt | None = None) -> Group:
    return Group(OneCollective(work, backend), 0, 2, 1, interrupt or Interrupt(), backend=backend)


def test_an_nccl_sum_is_waited_for_until_it_ends_on_the_gpu() -> None:
    work = QueuedWork(polls=30)
    group_over(work, "nccl").launch_allreduce(torch.zeros(4))()
    assert work.checked == 31 and work.waited == 1


def test_an_nccl_sum_that_never_ends_gives_way_to_the_interrupt() -> None:
    work, interrupt = QueuedWork(polls=None), Interrupt()
    wait = group_over(work, "nccl", interrupt).launch_allreduce(torch.zeros(4))
    timer = threading.Timer(0.2, interrupt.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Interrupted, match="allreduce"):
        wait()
    timer.join()
    assert time.monotonic() - started < 30  # heard, not left to a timeout (the Timer sets it after 0.2 s)
    assert work.checked > 1 and work.waited == 0  # never a call that could block on the GPU


def test_an_nccl_sum_that_ended_in_error_is_a_failed_collective() -> None:
    work = QueuedWork(polls=2, error="NCCL error: remote process exited or there was a network error")
    with pytest.raises(CollectiveFailed, match="allreduce: NCCL error: remote process exited"):
        group_over(work, "nccl").launch_allreduce(torch.zeros(4))()


def test_a_gloo_sum_waits_on_its_future_and_never_polls() -> None:
    work = QueuedWork(polls=None)  # would poll forever: gloo's future is its completion
    group_over(work, "gloo").launch_allreduce(torch.zeros(4))()
    assert work.checked == 0 and work.waited == 1
