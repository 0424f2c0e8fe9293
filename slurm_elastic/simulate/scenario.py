"""What a simulation is about: the cluster and its failures (a scenario, with published defaults), and the
figures our own benchmarks measured (read from their JSON files, never typed in)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["LLAMA3_FAILURES_PER_GPU_HOUR", "Measured", "Scenario"]

# Llama 3 405B: 419 unexpected interruptions in a 54-day snapshot on 16,384 H100s (Meta, "The Llama 3 Herd
# of Models", 2024, section 3.3.4): 419 / (54 * 24 * 16384) per GPU-hour, one job interruption every 3.1 h.
LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16384)


class Scenario(BaseModel):
    """The cluster, its failures and the workload's own costs. Times in hours unless a name says seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: int = Field(default=16384, ge=1, description="GPUs of the training job at full size")
    gpus_per_node: int = Field(default=8, ge=1)
    days: float = Field(default=30.0, gt=0, description="length of the simulated run")
    spare_nodes: int | None = Field(default=None, ge=0, description="idle nodes that replace failed ones (default 1%)")
    failures_per_gpu_hour: float = Field(default=LLAMA3_FAILURES_PER_GPU_HOUR, ge=0)
    rack_nodes: int = Field(default=16, ge=1, description="nodes that a rack failure takes at once")
    rack_failures_per_rack_day: float = Field(default=0.0, ge=0, description="correlated failures of a whole rack")
    repair_hours: float = Field(default=4.0, gt=0, description="mean time until a failed node is back (exponential)")
    preemption_bursts_per_day: float = Field(default=0.0, ge=0, description="higher-priority work arriving")
    preemption_nodes: int = Field(default=32, ge=1, description="nodes each burst takes")
    preemption_hours: float = Field(default=2.0, gt=0, description="how long a burst keeps its nodes")
    step_s: float = Field(default=10.0, gt=0, description="one training step of the plain DDP job")
    checkpoint_write_s: float = Field(default=30.0, ge=0, description="a blocking checkpoint write at this scale")
    restart_load_s: float = Field(default=300.0, ge=0, description="restart beyond Slurm's requeue: start, load")
    checkpoint_interval_s: float | None = Field(default=None, gt=0, description="default: Young/Daly's optimum")

    @model_validator(mode="after")
    def _whole_nodes(self) -> Scenario:
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"gpus={self.gpus} is not a whole number of nodes of {self.gpus_per_node} GPUs")
        return self

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def spares(self) -> int:
        return self.spare_nodes if self.spare_nodes is not None else math.ceil(self.nodes / 100)

    @property
    def hours(self) -> float:
        return self.days * 24.0

    @property
    def node_failures_per_hour(self) -> float:
        """Failures of one node (any of its GPUs) per hour."""
        return self.failures_per_gpu_hour * self.gpus_per_node


class Measured(BaseModel):
    """What our benchmarks measured, with the file each figure came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mttr_s: float = Field(gt=0, description="a node's loss to the next committed step, in-process recovery")
    join_s: float = Field(gt=0, description="a replacement node started to it training in the job")
    requeue_s: float = Field(gt=0, description="a node's loss to the next committed step, Slurm requeue")
    step_ratio: float = Field(gt=0, description="our step time over plain DDP's")
    sources: dict[str, str] = Field(default_factory=dict, description="figure -> the file and key it came from")
