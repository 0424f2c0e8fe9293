"""The per-job coordinator."""

from slurm_elastic.coordinator.config import CoordinatorConfig
from slurm_elastic.coordinator.server import Coordinator, CoordinatorThread

__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorThread"]
