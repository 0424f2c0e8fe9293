"""Where a job's files live, and the handle (address and secret) that lets tools reach its coordinator.

`$SLURM_ELASTIC_HOME/jobs/<job id>/` (default home: ~/.slurm-elastic, on the shared file system of a
cluster) holds `coordinator.json` (mode 0600: it carries the job's secret), `events.jsonl`, checkpoints
and, when asked for, the sample ledger.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_elastic.errors import ElasticError

HANDLE = "coordinator.json"


def home() -> Path:
    return Path(os.environ.get("SLURM_ELASTIC_HOME") or Path.home() / ".slurm-elastic")


def job_dir(job_id: str, root: Path | None = None) -> Path:
    return (root or home()) / "jobs" / job_id


@dataclass(frozen=True)
class JobHandle:
    job_id: str
    address: str
    secret: str
    host: str
    pid: int
    started: float

    def write(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / HANDLE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: Path) -> JobHandle:
        path = directory / HANDLE
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise ElasticError(f"no running job found at {directory} (missing {HANDLE})") from None
        except (ValueError, TypeError) as exc:
            raise ElasticError(f"{path} is not a valid job handle: {exc}") from None


def find_job(job_id: str, root: Path | None = None) -> JobHandle:
    directory = job_dir(job_id, root)
    if not directory.is_dir():
        base = (root or home()) / "jobs"
        known = sorted(p.name for p in base.iterdir())[-10:] if base.is_dir() else []
        hint = f"; known jobs: {', '.join(known)}" if known else ""
        raise ElasticError(f"no job {job_id!r} under {base}{hint}")
    return JobHandle.read(directory)


def new_local_job_id() -> str:
    return f"local-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


LAUNCH = "launch.json"


@dataclass(frozen=True)
class LaunchInfo:
    """How to start one more node of a running job (read by satellite agents)."""

    command: list[str]
    nproc_per_node: int
    max_restarts: int
    drain_grace_s: float
    heartbeat_interval_s: float
    worker_env: dict[str, str]
    launcher: str = "slurm"  # "local": `slurm-elastic run --local` (grow and reclaim start and stop local agents)
    cwd: str | None = None  # where the training command runs (a local job's working directory)

    def write(self, directory: Path) -> Path:
        path = directory / LAUNCH
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: Path) -> LaunchInfo:
        try:
            return cls(**json.loads((directory / LAUNCH).read_text()))
        except FileNotFoundError:
            raise ElasticError(f"no running job found at {directory} (missing {LAUNCH})") from None
        except (ValueError, TypeError) as exc:
            raise ElasticError(f"{directory / LAUNCH} is not valid: {exc}") from None


def hook_comment(directory: Path) -> str:
    """The Slurm job comment that lets the admin hooks find the job's coordinator."""
    return f"slurm-elastic:{(directory / HANDLE).resolve()}"
