"""What one data-parallel replica holds: model, optimizer, scheduler, RNG, and its place in the sample stream.

Peers transfer it (in-process recovery, joins) and disaster-recovery checkpoints store it, always as the
same Snapshot, so a replica restored either way is the same replica.
"""

from __future__ import annotations

from typing import Any

import torch

from slurm_elastic.worker.comm import Group
from slurm_elastic.worker.state import Snapshot, capture, fingerprint, restore
from slurm_elastic.worker.sync import SyncResult, synchronize


class Replica:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.step = 0  # committed optimizer steps
        self.cursor = 0  # committed position in the global sample stream
        self.reference_world: int | None = None  # the world the learning rate was set for (scale-LR policy)
        self.fresh = True  # holds no committed state yet (a joiner before its first transfer)

    @property
    def committed_step(self) -> int:
        """-1 while fresh: a peer with any committed state is preferred as a source."""
        return -1 if self.fresh else self.step

    def progress(self) -> dict[str, Any]:
        return {"step": self.step, "cursor": self.cursor, "reference_world": self.reference_world}

    def capture(self) -> Snapshot:
        return capture(self.model, self.optimizer, self.scheduler, self.progress())

    def restore(self, snap: Snapshot) -> None:
        progress = restore(self.model, self.optimizer, self.scheduler, snap)
        self.step, self.cursor = int(progress["step"]), int(progress["cursor"])
        if progress.get("reference_world") is not None:
            self.reference_world = int(progress["reference_world"])
        self.fresh = False

    def synchronize(self, group: Group, store: Any, key_prefix: str, members: list[str]) -> SyncResult:
        """Every member of the generation ends holding the same committed state (full replicas)."""
        result = synchronize(group, store, key_prefix, self.committed_step, self.fingerprint(), self.capture)
        if result.received is not None:
            self.restore(result.received)
        self.fresh = False
        return result

    def fingerprint(self) -> tuple[float, float]:
        return fingerprint(self.model)

    def optimizer_step(self, lr_factor: float) -> None:
        """One optimizer and scheduler step, with the learning rate scaled by `lr_factor` for this step only."""
        if lr_factor == 1.0:
            self.optimizer.step()
        else:
            saved = [group["lr"] for group in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * lr_factor
            try:
                self.optimizer.step()
            finally:
                for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
                    group["lr"] = lr
        if self.scheduler is not None:
            self.scheduler.step()

    def commit(self, step: int, samples: int) -> None:
        self.step, self.cursor, self.fresh = step, self.cursor + samples, False
