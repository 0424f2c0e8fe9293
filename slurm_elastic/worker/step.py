"""One attempt at one optimizer step, as the user's loop sees it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from slurm_elastic.decide.batching import MicroBatch, micro_batch_seed
from slurm_elastic.errors import ElasticError

if TYPE_CHECKING:
    from slurm_elastic.worker.job import ElasticJob


class Step:
    """Step `number` on this rank: iterate `micro_batches()` and call `backward(loss)` for each.

    If the generation changes while the step runs, the iteration ends early and the library re-runs the
    same step (the same global samples) in the new generation; the user's loop needs no special case.
    """

    def __init__(self, job: ElasticJob, number: int, micro: tuple[MicroBatch, ...], lr_factor: float) -> None:
        self._job = job
        self.number = number
        self.rank = job.rank
        self.world_size = job.world_size
        self.lr_factor = lr_factor
        self.aborted = False
        self.ranges: list[tuple[int, int]] = []
        self._micro = micro
        self._current: MicroBatch | None = None

    def micro_batches(self) -> Iterator[Any]:
        job = self._job
        for mb in self._micro:
            if job.interrupted():
                self.aborted = True
                return
            start = job.cursor + mb.offset
            batch = job.load_batch(start, mb.size)
            torch.manual_seed(micro_batch_seed(job.seed, self.number, mb.index))
            self._current = mb
            job.set_phase("compute")
            yield batch
            if self._current is not None:
                raise ElasticError(f"step {self.number}: call step.backward(loss) once for every micro-batch")
            self.ranges.append((start, start + mb.size))

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate the micro-batch's mean loss; the library weights it by the micro-batch's share."""
        mb = self._current
        if mb is None:
            raise ElasticError("step.backward() must be called once, inside `for batch in step.micro_batches()`")
        self._current = None
        if self.aborted:
            return
        loss.backward()
        self._job.accumulate(mb.weight, loss)
