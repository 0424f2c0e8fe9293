"""The one boundary to Slurm: every sbatch/srun/scontrol/squeue/scancel/sinfo call goes through here.

`get_backend()` picks the implementation: `SLURM_ELASTIC_SLURM_BACKEND=cli|pyslurm|auto` (default auto:
pyslurm when it imports and answers, else the CLI).
"""

from __future__ import annotations

import os

from slurm_elastic.errors import ConfigError
from slurm_elastic.logs import get_logger

from .backend import SlurmBackend, srun_argv
from .cli_backend import CliBackend
from .errors import JobNotFound, SlurmCommandError
from .hostlist import compress_hostlist, expand_hostlist
from .records import JobInfo, NodeInfo, SlurmVersion

__all__ = [
    "CliBackend",
    "JobInfo",
    "JobNotFound",
    "NodeInfo",
    "SlurmBackend",
    "SlurmCommandError",
    "SlurmVersion",
    "compress_hostlist",
    "expand_hostlist",
    "get_backend",
    "srun_argv",
]

ENV_VAR = "SLURM_ELASTIC_SLURM_BACKEND"
CHOICES = ("auto", "cli", "pyslurm")
log = get_logger(__name__)


def get_backend(prefer: str | None = None) -> SlurmBackend:
    """The backend named by `prefer`, else by $SLURM_ELASTIC_SLURM_BACKEND, else auto."""
    raw = prefer if prefer is not None else os.environ.get(ENV_VAR, "auto")
    choice = raw.strip().lower() or "auto"
    if choice not in CHOICES:
        source = "argument prefer" if prefer is not None else ENV_VAR
        raise ConfigError(f"{source}={raw!r} is not a Slurm backend; valid: {', '.join(CHOICES)}")
    if choice == "cli":
        return CliBackend()
    from .pyslurm_backend import PyslurmBackend

    if choice == "pyslurm":
        return PyslurmBackend()
    try:
        backend = PyslurmBackend()
        backend.nodes()  # "works": it must reach slurmctld, not only import
    except Exception as exc:  # any failure of the optional backend falls back to the tested one
        log.debug("slurm.backend.pyslurm_unavailable", error=str(exc))
        return CliBackend()
    return backend
