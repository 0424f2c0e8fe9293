"""One attempt at one optimizer step, as the user's loop sees it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from slurm_elastic.decide.batching import MicroBatch, micro_batch_seed
from slurm_elastic.errors import UsageError
from slurm_elastic.wire.messages import Phase
from slurm_elastic.worker.rng import seed_torch


class StepHost(Protocol):
    """What a step needs from the job that runs it."""

    seed: int

    def interrupted(self) -> bool: ...

    def batch(self, start: int, size: int) -> Any: ...

    def set_phase(self, phase: Phase) -> None: ...

    def backward_micro_batch(self, step: Step, mb: MicroBatch, loss: torch.Tensor, closing: bool) -> None: ...

    def close_without_micro_batches(self, step: Step) -> None: ...


class Step:
    """Step `number` on this rank: iterate `micro_batches()` and call `backward(loss)` for each.

    If the generation changes while the step runs, the iteration ends early and the library re-runs the
    same step (the same global samples) in the new generation; the user's loop needs no special case.
    """

    def __init__(
        self, host: StepHost, number: int, first: int, micro: tuple[MicroBatch, ...], rank: int, world: int
    ) -> None:
        self._host = host
        self.number = number
        self.first = first  # the stream position of the step's first sample
        self.rank = rank
        self.world_size = world
        self.aborted = False
        self.complete = False  # every micro-batch was back-propagated
        self.backwarded = 0  # micro-batches back-propagated so far
        self.ranges: list[tuple[int, int]] = []
        self._micro = micro
        self._current: MicroBatch | None = None

    def micro_batches(self) -> Iterator[Any]:
        host = self._host
        if not self._micro:  # more ranks than micro-batches: this rank only takes part in the sum
            host.close_without_micro_batches(self)
            self.complete = True
            return
        for mb in self._micro:
            if host.interrupted():
                self.aborted = True
                return
            batch = host.batch(self.first + mb.offset, mb.size)
            seed_torch(micro_batch_seed(host.seed, self.number, mb.index))
            self._current = mb
            host.set_phase("compute")
            yield batch
            if self._current is not None:
                raise UsageError(
                    f"step {self.number}: call job.backward(loss) (not loss.backward()) once for every micro-batch"
                )
        self.complete = not self.aborted

    @property
    def all_backwarded(self) -> bool:
        return self.backwarded == len(self._micro)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate the micro-batch's mean loss; the library weights it by the micro-batch's share."""
        mb = self._current
        if mb is None:
            raise UsageError("step.backward() must be called once, inside `for batch in step.micro_batches()`")
        self._current = None
        self.backwarded += 1
        if self.aborted:
            return
        start = self.first + mb.offset
        if not mb.padding:
            self.ranges.append((start, start + mb.size))
        closing = mb is self._micro[-1]
        self._host.backward_micro_batch(self, mb, loss, closing)
