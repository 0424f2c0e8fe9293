"""The worker library: what runs inside each training process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurm_elastic.worker.checkpoints.checkpoint import read_model_state
from slurm_elastic.worker.input.data import ElasticLoader
from slurm_elastic.worker.job import ElasticJob
from slurm_elastic.worker.step import Step

if TYPE_CHECKING:
    from slurm_elastic.worker.sharded.mesh import placeholder_mesh


def __getattr__(name: str) -> Any:
    # Lazy: the sharded path (and torch's private FSDP2 modules under it) loads only for a script that uses it.
    if name == "placeholder_mesh":
        from slurm_elastic.worker.sharded.mesh import placeholder_mesh

        return placeholder_mesh
    raise AttributeError(f"module 'slurm_elastic.worker' has no attribute {name!r}")


__all__ = ["ElasticJob", "ElasticLoader", "Step", "placeholder_mesh", "read_model_state"]
