"""What an `ElasticJob` was asked for besides its model, optimizer and scheduler: checked once, at construction,
each bad value refused in one line that names it, and the environment's defaults filled in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_elastic.decide.batching import BatchPolicy, LrRule, PreserveGlobalBatch, ScaleLearningRate, plan_step
from slurm_elastic.decide.epochs import positive_int
from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.env import WorkerEnv
from slurm_elastic.worker.input.data import DataSettings, data_settings
from slurm_elastic.worker.input.sampled import BatchFn, check_multiple
from slurm_elastic.worker.replicated.reduction import DEFAULT_BUCKET_MB

DEFAULT_PREFETCH = 4
DEFAULT_KEEP_CHECKPOINTS = 2


@dataclass(frozen=True)
class JobSettings:
    data: DataSettings
    global_batch: int | None  # preserve this global batch (None with per_replica_batch: scale the learning rate)
    per_replica_batch: int | None
    lr_rule: LrRule
    reference_world: int | None
    seed: int
    clip_grad_norm: float | None
    reduce_dtype_asked: str | None  # the script's own choice (a sharded model refuses any but float32)
    reduce_dtype: str  # the script's, else the environment's, else float32
    bucket_mb: float
    prefetch: int  # batches read ahead
    keep_checkpoints: int
    resume_from: Path | None
    start_step: int | None  # the step of the script's own checkpoint, loaded by the script

    @classmethod
    def of(
        cls,
        env: WorkerEnv,
        *,
        dataset: Any | None,
        loader: Any | None,
        micro_batch: int | None,
        global_batch: int | None,
        per_replica_batch: int | None,
        lr_rule: LrRule,
        reference_world: int | None,
        seed: int,
        shuffle: bool | None,
        collate_fn: Callable[[list[Any]], Any] | None,
        num_workers: int | None,
        pin_memory: bool | None,
        clip_grad_norm: float | None,
        reduce_dtype: str | None,
        bucket_mb: float | None,
        prefetch: int | None,
        resume_from: str | os.PathLike[str] | None,
        keep_checkpoints: int | None,
        batch_fn: BatchFn | None = None,
        start_step: int | None = None,
    ) -> JobSettings:
        if global_batch is not None and per_replica_batch is not None:
            raise ConfigError("give global_batch (preserve the global batch) or per_replica_batch, not both")
        data = data_settings(
            dataset=dataset, loader=loader, micro_batch=micro_batch, collate_fn=collate_fn,
            num_workers=num_workers, pin_memory=pin_memory, shuffle=shuffle, batch_fn=batch_fn,
        )  # fmt: skip
        keep = positive_int("keep_checkpoints", keep_checkpoints) if keep_checkpoints is not None else None
        depth = prefetch if prefetch is not None else env.prefetch
        settings = cls(
            data=data,
            global_batch=global_batch,
            per_replica_batch=per_replica_batch,
            lr_rule=lr_rule,
            reference_world=reference_world,
            seed=seed,
            clip_grad_norm=_clip(clip_grad_norm),
            reduce_dtype_asked=reduce_dtype,
            reduce_dtype=reduce_dtype or env.reduce_dtype or "float32",
            bucket_mb=bucket_mb or env.bucket_mb or DEFAULT_BUCKET_MB,
            prefetch=max(DEFAULT_PREFETCH, 2 * data.num_workers) if depth is None else depth,
            keep_checkpoints=keep or env.checkpoint_keep or DEFAULT_KEEP_CHECKPOINTS,
            resume_from=Path(resume_from) if resume_from is not None else None,
            start_step=_start_step(start_step, global_batch),
        )
        plan_step(settings.batch_policy(None, None), 1)  # the batch arguments, checked now with a clear error
        if batch_fn is not None:
            check_multiple(data.micro_batch, global_batch=global_batch, per_replica_batch=per_replica_batch)
        return settings

    def batch_policy(self, first_global_batch: int | None, reference_world: int | None) -> BatchPolicy:
        """The step's batch policy: the script's global batch, else the first generation's (`first_global_batch`);
        with `per_replica_batch`, the learning rate scaled from the world it was set for."""
        micro = self.data.micro_batch
        if self.per_replica_batch is None:
            return PreserveGlobalBatch(self.global_batch or first_global_batch or micro, micro)
        return ScaleLearningRate(self.per_replica_batch, micro, reference_world or 1, self.lr_rule)


def _clip(norm: float | None) -> float | None:
    """The norm to clip the summed gradient to; None or 0 clip nothing (as `grad_clip = 0.0` in many scripts)."""
    if norm is None:
        return None
    if isinstance(norm, bool) or not isinstance(norm, int | float) or not norm >= 0 or norm == float("inf"):
        raise ConfigError(f"invalid clip_grad_norm {norm!r}: expected a norm > 0, or 0 or None for no clipping")
    return float(norm) or None


def _start_step(step: int | None, global_batch: int | None) -> int | None:
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"invalid start_step {step!r}: expected the integer step (>= 0) of the script's checkpoint")
    if global_batch is None:
        raise ConfigError("start_step= needs global_batch=: the data resumes at start_step x global_batch samples")
    return step


__all__ = ["DEFAULT_PREFETCH", "JobSettings"]
