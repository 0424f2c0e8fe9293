"""The worker library: what runs inside each training process."""

from slurm_elastic.worker.job import ElasticJob
from slurm_elastic.worker.step import Step

__all__ = ["ElasticJob", "Step"]
