"""The per-job coordinator."""

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.server import Coordinator
from slurm_elastic.coordinator.thread import CoordinatorThread

__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorThread"]
