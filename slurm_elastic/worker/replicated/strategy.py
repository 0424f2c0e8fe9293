"""Replicated data-parallel training (DDP's kind): every rank holds the whole model, optimizer and scheduler.

During a step's last micro-batch the gradients are summed over the ranks in buckets as they become ready
(`reduction.py`), together with the step's loss and the "membership change wanted" flag; the optimizer then
steps on every rank alike. A rank behind its peers takes the whole state from them (`replica.py`, `sync.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.decide.batching import MicroBatch, StepPlan
from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoints.checkpoint import DisasterRecovery
from slurm_elastic.worker.lossscale import LossScaling
from slurm_elastic.worker.membership.comm import Group
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.replicated import snapshot
from slurm_elastic.worker.replicated.reduction import GradientReducer, reduce_dtype_of
from slurm_elastic.worker.replicated.replica import Replica
from slurm_elastic.worker.replicated.sync import synchronize
from slurm_elastic.worker.strategy import Report, SyncResult

log = get_logger("slurm_elastic.worker")


class ReplicatedStrategy:
    every_rank_saves = False

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        extra: dict[str, Any],
        *,
        reduce_dtype: str,
        bucket_mb: float,
        clip: float | None,
        scaling: LossScaling | None = None,
        phases: PhaseHooks,
        change_requested: Callable[[], bool],
    ) -> None:
        self.held = Replica(model, optimizer, scheduler, extra, scaling)
        self._scaling = scaling
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._reducer = GradientReducer(self._params, reduce_dtype_of(reduce_dtype), bucket_mb=bucket_mb)
        self._clip = clip
        self._phases = phases
        self._change_requested = change_requested

    @property
    def reduce_dtype(self) -> str:
        return self._reducer.reduce_dtype

    def micro_batches(self, plan: StepPlan, rank: int) -> tuple[MicroBatch, ...]:
        return plan.for_rank(rank)

    def begin(self, group: Group | None, number: int) -> None:
        alone = group is None or group.world == 1
        self._reducer.begin(None if alone else group, on_launch=lambda _bucket: self._phases.fire("bucket", number))

    def backward(self, loss: torch.Tensor, mb: MicroBatch, last: bool) -> None:
        self._reducer.add_control(loss, mb.weight, self._change_requested() if last else None)
        scaled = self._scaling.scale(loss) if self._scaling is not None else loss
        self._reducer.backward(scaled, mb.weight, closing=last)

    def contribute_nothing(self) -> None:
        self._reducer.add_control(torch.zeros(()), 0.0, self._change_requested())
        self._reducer.launch_rest()

    def finish(self) -> tuple[float, bool]:
        return self._reducer.wait()

    def commit(self, number: int, plan: StepPlan) -> None:
        scaling = self._scaling
        if scaling is not None:
            scaling.unscale(self.held.optimizer, self._params[0].device)  # the summed gradients, alike everywhere
        if self._clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params, self._clip)
        skip = scaling is not None and not scaling.finite(self._params)
        self.held.optimizer_step(plan.lr_factor, skip=skip)
        if scaling is not None:
            if skip:
                log.info("overflow_step_skipped", step=number, scale=scaling.scaler.get_scale())
            scaling.update()
        self._reducer.after_optimizer()
        self._phases.fire("commit", number)
        self.held.commit(number, plan.step_samples)

    def abandon(self) -> None:
        self._reducer.abandon()  # an abandoned sum may still write into the old buffers

    def heal(
        self, group: Group, store: Any, key_prefix: str, members: list[str], before_transfer: Callable[[], None]
    ) -> SyncResult:
        held = self.held
        fp = held.fingerprint()
        result = synchronize(group, store, key_prefix, held.committed_step, fp, held.capture, before_transfer)
        if result.received is not None:
            held.restore(result.received)
        held.fresh = False
        return result

    def start_alone(self, group: Group, member: str) -> None:
        pass  # the replica is whole already

    def checkpoints(self, directory: Path, every: int, background: bool, report: Report, keep: int) -> DisasterRecovery:
        return DisasterRecovery(directory, every, background, report, keep)

    def save(self, path: Path) -> None:
        snapshot.save(self.held, path)

    def resume(self, path: Path) -> None:
        log.info("resumed_from_snapshot", path=str(path), step=snapshot.resume(self.held, path))

    def generation_fields(self) -> dict[str, Any]:
        return {"reduce_dtype": self._reducer.reduce_dtype, "buckets": self._reducer.bucket_count}

    def hook_backward_phase(self) -> None:
        if self._params:  # fires inside autograd, as the first gradient arrives
            held, phases = self.held, self._phases
            self._params[0].register_hook(lambda grad: phases.fire("backward", held.step + 1))


__all__ = ["ReplicatedStrategy"]
