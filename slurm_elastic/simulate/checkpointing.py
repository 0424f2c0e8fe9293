"""Checkpoint-restart in closed form (Young 1974, Daly 2006): the interval that wastes least, and the expected
share of time that goes to training with exponentially distributed failures."""

from __future__ import annotations

import math

__all__ = ["expected_goodput", "young_daly_interval"]


def young_daly_interval(write_h: float, mtbf_h: float, floor_h: float) -> float:
    """Compute between two checkpoints: sqrt(2 * write * MTBF) (first order), never below `floor_h` (a step:
    a free checkpoint is still taken at a step boundary)."""
    if mtbf_h == math.inf:
        return math.inf
    return max(math.sqrt(2.0 * write_h * mtbf_h), floor_h)


def expected_goodput(interval_h: float, write_h: float, restart_h: float, mtbf_h: float) -> float:
    """Daly's exact expectation for exponential failures that can strike at any time, a write or a restart
    included: useful time over wall time, `interval_h` of compute per `write_h` checkpoint."""
    if mtbf_h == math.inf:
        return interval_h / (interval_h + write_h)
    m = mtbf_h
    return interval_h / (m * math.exp(restart_h / m) * math.expm1((interval_h + write_h) / m))
