"""The script's own snapshots of a replicated job: `job.save(path)` and `ElasticJob(..., resume_from=path)`.

A replicated job holds the whole state on every rank: one rank writes it to one file, atomically, in the
format of the job's own checkpoints. (A sharded job's snapshot is a directory of shards: `sharded.strategy`.)
"""

from __future__ import annotations

from pathlib import Path

from slurm_elastic.worker.checkpoints.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from slurm_elastic.worker.checkpoints.state import StateError
from slurm_elastic.worker.replicated.replica import Replica


def save(replica: Replica, path: Path) -> None:
    write_checkpoint(path, replica.step, replica.capture())


def resume(replica: Replica, path: Path) -> int:
    """Restore `replica` from the snapshot at `path`; the snapshot's step."""
    step, snap = read_checkpoint(path)
    try:
        replica.restore(snap)
    except (StateError, RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{path} does not fit this job's model or optimizer: {str(exc)[:300]}") from None
    return step


__all__ = ["resume", "save"]
