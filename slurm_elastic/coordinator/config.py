"""What a coordinator needs to know, derived from the job's configuration by the launcher."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from slurm_elastic.agentspec import HEARTBEAT_INTERVAL_S, LEASE_TIMEOUT_S

if TYPE_CHECKING:
    from slurm_elastic.config import JobConfig


@dataclass(frozen=True)
class CoordinatorConfig:
    job_id: str
    secret: str = field(repr=False)
    expected_workers: int
    min_workers: int = 1
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # the address workers should dial, when it differs from the bind address
    port: int = 0
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    lease_timeout_s: float = LEASE_TIMEOUT_S
    hang_timeout_s: float = 60.0
    rendezvous_timeout_s: float = 300.0
    pg_timeout_s: float = 60.0
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    recovery: Literal["in_process", "restart", "requeue"] = "in_process"
    checkpoints: bool = False  # workers write disaster-recovery checkpoints (a fallback when all holders die)
    max_identical_failures: int = 3
    progress_interval_s: float = 10.0
    events_path: Path | None = None
    record_commits: bool = False
    run: int = 0  # the job's restart count (SLURM_RESTART_COUNT of the core job)


def coordinator_config(
    cfg: JobConfig,
    *,
    job_id: str,
    secret: str,
    job_dir: Path,
    workers: int,
    host: str,
    run: int = 0,
    checkpoints: bool | None = None,
) -> CoordinatorConfig:
    """The coordinator's part of a job's settings, for a job of `workers` training processes."""
    return CoordinatorConfig(
        job_id=job_id,
        secret=secret,
        expected_workers=workers,
        min_workers=min(cfg.min_workers, workers),
        host=host,
        port=cfg.port,
        heartbeat_interval_s=cfg.heartbeat_interval_s,
        lease_timeout_s=cfg.lease_timeout_s,
        hang_timeout_s=cfg.hang_timeout_s,
        rendezvous_timeout_s=cfg.rendezvous_timeout_s,
        pg_timeout_s=cfg.pg_timeout_s,
        backend=cfg.backend,
        recovery=cfg.recovery,
        checkpoints=cfg.checkpoint_dir is not None if checkpoints is None else checkpoints,
        max_identical_failures=cfg.max_identical_failures,
        progress_interval_s=cfg.progress_interval_s,
        events_path=job_dir / "events.jsonl",
        record_commits=cfg.record_commits,
        run=run,
    )
