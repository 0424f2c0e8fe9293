"""The script's own snapshots: `job.save(path)` and `ElasticJob(..., resume_from=path)`.

A replicated job holds the whole state on every rank: one rank writes it to one file, atomically. A sharded
(FSDP2) job's state exists only as shards: every rank calls `job.save(path)`, and the ranks of the first
replica group each write their shard under `path` as the job's own sharded checkpoints are written, so the
snapshot loads at any world size. A sharded snapshot is used only once every shard of it was written.
"""

from __future__ import annotations

from pathlib import Path

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from slurm_elastic.worker.replica import Replica
from slurm_elastic.worker.sharded.checkpoint import complete_checkpoints, save_snapshot
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.state import StateError

log = get_logger("slurm_elastic.worker")


def save(replica: Replica | ShardedReplica, path: Path) -> Path:
    if isinstance(replica, ShardedReplica):
        save_snapshot(path, replica)
    else:
        write_checkpoint(path, replica.step, replica.capture())
    log.info("snapshot_saved", path=str(path), step=replica.step)
    return path


def resume(replica: Replica | ShardedReplica, path: Path) -> None:
    """Start from the snapshot at `path`; a path that does not exist yet is a first run, and starts fresh."""
    if not path.exists():
        log.info("no_snapshot_to_resume", path=str(path))
        return
    if isinstance(replica, ShardedReplica):
        found = complete_checkpoints(path)
        if not found:
            raise CheckpointError(
                f"{path} holds no complete sharded snapshot: a fully_shard job's save() must run on every rank"
            )
        replica.checkpoint_dir = path  # read, re-sharded to this world, when the first generation forms
        log.info("resuming_from_snapshot", path=str(path), step=found[-1][0], saved_world=found[-1][1])
        return
    step, snap = read_checkpoint(path)
    try:
        replica.restore(snap)
    except (StateError, RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"{path} does not fit this job's model or optimizer: {str(exc)[:300]}") from None
    log.info("resumed_from_snapshot", path=str(path), step=step)


__all__ = ["resume", "save"]
