"""What one data-parallel replica holds: model, optimizer, scheduler, RNG, its place in the sample stream,
and the user's own registered state (`userstate.py`).

Peers transfer it (in-process recovery, joins) and disaster-recovery checkpoints store it, always as the
same Snapshot, so a replica restored either way is the same replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from slurm_elastic.worker.checkpoints import userstate
from slurm_elastic.worker.checkpoints.state import Snapshot, capture, fingerprint, restore_all
from slurm_elastic.worker.lossscale import LossScaling


class Replica:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        extra: dict[str, Any] | None = None,
        scaling: LossScaling | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.extra: dict[str, Any] = extra if extra is not None else {}  # the user's dict, restored in place
        self.step = 0  # committed optimizer steps
        self.cursor = 0  # committed position in the global sample stream
        self.reference_world: int | None = None  # the world the learning rate was set for (scale-LR policy)
        self.global_batch: int | None = None  # set by the first generation when the script gave no batch policy
        self.fresh = True  # holds no committed state yet (a joiner before its first transfer)
        self.step_fn: Callable[[], Any] = optimizer.step  # the real step (the script's own may be a no-op)
        self.scaling = scaling  # float16's gradient scaler, whose scale is part of the replica

    @property
    def committed_step(self) -> int:
        """-1 while fresh: a peer with any committed state is preferred as a source."""
        return -1 if self.fresh else self.step

    def progress(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "cursor": self.cursor,
            "reference_world": self.reference_world,
            "global_batch": self.global_batch,
            "scaler": self.scaling.state() if self.scaling is not None else None,
        }

    def capture(self) -> Snapshot:
        return capture(self.model, self.optimizer, self.scheduler, self.progress(), userstate.capture(self.extra))

    def restore(self, snap: Snapshot) -> None:
        progress, extra = restore_all(self.model, self.optimizer, self.scheduler, snap)
        userstate.restore(self.extra, extra)
        self.step, self.cursor = int(progress["step"]), int(progress["cursor"])
        if progress.get("reference_world") is not None:
            self.reference_world = int(progress["reference_world"])
        if progress.get("global_batch") is not None:
            self.global_batch = int(progress["global_batch"])
        if self.scaling is not None:
            self.scaling.load(progress.get("scaler"))
        self.fresh = False

    def fingerprint(self) -> tuple[float, float]:
        return fingerprint(self.model)

    def optimizer_step(self, lr_factor: float, *, skip: bool = False) -> None:
        """One optimizer and scheduler step, with the learning rate scaled by `lr_factor` for this step only;
        `skip`: the scheduler's only (float16 gradients that overflowed, as GradScaler.step skips them)."""
        if skip:
            pass  # the learning rate's schedule goes on, as with GradScaler.step in the script's own loop
        elif lr_factor == 1.0:
            self.step_fn()
        else:
            saved = [group["lr"] for group in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * lr_factor
            try:
                self.step_fn()
            finally:
                for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
                    group["lr"] = lr
        if self.scheduler is not None:
            self.scheduler.step()

    def commit(self, step: int, samples: int) -> None:
        self.step, self.cursor, self.fresh = step, self.cursor + samples, False
