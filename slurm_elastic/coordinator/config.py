"""What a coordinator needs to know, derived from the job's configuration by the launcher."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class CoordinatorConfig:
    job_id: str
    secret: str
    expected_workers: int
    min_workers: int = 1
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # the address workers should dial, when it differs from the bind address
    port: int = 0
    store_port: int = 0
    heartbeat_interval_s: float = 1.0
    lease_timeout_s: float = 10.0
    hang_timeout_s: float = 60.0
    rendezvous_timeout_s: float = 300.0
    pg_timeout_s: float = 60.0
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    recovery: Literal["in_process", "restart", "requeue"] = "in_process"
    max_identical_failures: int = 3
    progress_interval_s: float = 10.0
    events_path: Path | None = None
    record_commits: bool = False
    run: int = 0  # the job's restart count (SLURM_RESTART_COUNT of the core job)
