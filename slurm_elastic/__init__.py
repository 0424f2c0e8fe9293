"""slurm-elastic: checkpointless, elastic PyTorch data-parallel training on Slurm."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
