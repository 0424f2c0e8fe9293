"""The worker library: what runs inside each training process."""

from slurm_elastic.worker.checkpoint import read_model_state
from slurm_elastic.worker.data import ElasticLoader
from slurm_elastic.worker.job import ElasticJob
from slurm_elastic.worker.sharded.mesh import placeholder_mesh
from slurm_elastic.worker.step import Step

__all__ = ["ElasticJob", "ElasticLoader", "Step", "placeholder_mesh", "read_model_state"]
