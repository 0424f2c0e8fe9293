"""slurm-elastic: checkpointless, elastic PyTorch data-parallel training on Slurm."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ElasticError",
    "ElasticJob",
    "ElasticLoader",
    "FaultPlan",
    "Step",
    "UsageError",
    "__version__",
    "placeholder_mesh",
    "read_model_state",
]

from slurm_elastic.errors import ElasticError, UsageError
from slurm_elastic.jobsecret import take_from_environment

# First of all: the job's secret out of the descriptor and the variable the node agent handed it over in,
# before the training code can start a process that would inherit them (see jobsecret).
take_from_environment()

if TYPE_CHECKING:
    from slurm_elastic.faults import FaultPlan
    from slurm_elastic.worker import ElasticJob, ElasticLoader, Step, placeholder_mesh, read_model_state


def __getattr__(name: str) -> Any:
    # Lazy: the agent and command-line tools import this package without paying for torch.
    if name in ("ElasticJob", "ElasticLoader", "Step", "placeholder_mesh", "read_model_state"):
        from slurm_elastic import worker

        return getattr(worker, name)
    if name == "FaultPlan":
        from slurm_elastic.faults import FaultPlan

        return FaultPlan
    raise AttributeError(f"module 'slurm_elastic' has no attribute {name!r}")
