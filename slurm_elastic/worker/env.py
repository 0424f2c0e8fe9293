"""What the agent tells a worker through its environment. Absent a coordinator, the worker runs alone.

The job's secret is never in the environment: the agent hands it over through an inherited pipe, which
`import slurm_elastic` reads and closes (slurm_elastic.jobsecret); the user's training code, and every
process it starts, never inherit it. The library keeps it in this process's memory only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.faults import FaultPlan
from slurm_elastic.jobsecret import SECRET_FD, Secret, handed_over

PREFIX = "SLURM_ELASTIC_"


@dataclass(frozen=True)
class WorkerEnv:
    coordinator: str | None
    secret: str = field(repr=False)
    job_id: str
    node: str
    local_rank: int
    worker_id: str
    incarnation: int
    run: int  # how many times the whole job was restarted (Slurm requeues), for the ledger
    ledger_dir: Path | None
    checkpoint_dir: Path | None
    checkpoint_every: int
    checkpoint_background: bool
    faults: FaultPlan
    reduce_dtype: str | None = None  # the job's setting; an explicit ElasticJob argument wins
    bucket_mb: float | None = None
    prefetch: int | None = None
    checkpoint_keep: int | None = None  # the job's setting; ElasticJob(keep_checkpoints=) wins; default 2
    store: str | None = None  # the node's store relay (unix:PATH); None: the coordinator's store itself
    control: str | None = None  # the node's control relay (unix:PATH); None: the coordinator itself

    @property
    def standalone(self) -> bool:
        return self.coordinator is None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"invalid {PREFIX}{name}: {raw!r} (expected an integer >= 0)") from None
    if value < 0:
        raise ConfigError(f"invalid {PREFIX}{name}: {raw!r} (expected an integer >= 0)")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(PREFIX + name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"invalid {PREFIX}{name}: {raw!r} (expected a number > 0)")
    return value


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(PREFIX + name)
    return Path(raw) if raw else None


def worker_env(env: Mapping[str, str] | None = None, *, secret: str | None = None) -> WorkerEnv:
    """The worker's settings from `env` (os.environ by default); the job's secret is `secret`, by default
    the one this process's node agent handed over (read at `import slurm_elastic`)."""
    env = os.environ if env is None else env
    coordinator = env.get(PREFIX + "COORDINATOR") or None
    if coordinator and secret is None:
        secret = handed_over()  # raises the hand-over's failure, naming SLURM_ELASTIC_SECRET_FD
    if coordinator and not secret:
        raise ConfigError(
            f"{PREFIX}COORDINATOR is set but no secret was handed over ({SECRET_FD} is missing): "
            "workers are started by the node agent (slurm-elastic run, the sbatch templates)"
        )
    node = env.get(PREFIX + "NODE", "standalone")
    local_rank = _int(env, "LOCAL_RANK", 0)
    incarnation = _int(env, "INCARNATION", 0)
    return WorkerEnv(
        coordinator=coordinator,
        secret=Secret(secret or ""),
        job_id=env.get(PREFIX + "JOB_ID", "standalone"),
        node=node,
        local_rank=local_rank,
        worker_id=env.get(PREFIX + "WORKER_ID", f"{node}:{local_rank}:{incarnation}"),
        incarnation=incarnation,
        run=_int(env, "RUN", 0),
        ledger_dir=_path(env, "LEDGER_DIR"),
        checkpoint_dir=_path(env, "CHECKPOINT_DIR"),
        checkpoint_every=_int(env, "CHECKPOINT_EVERY", 0),
        checkpoint_background=env.get(PREFIX + "CHECKPOINT_SYNC", "") not in ("1", "true", "yes"),
        faults=FaultPlan.from_env(dict(env)),
        reduce_dtype=env.get(PREFIX + "REDUCE_DTYPE") or None,
        bucket_mb=_float(env, "BUCKET_MB"),
        prefetch=_int(env, "PREFETCH", -1) if env.get(PREFIX + "PREFETCH") else None,
        checkpoint_keep=_int(env, "CHECKPOINT_KEEP", 0) or None,
        store=env.get(PREFIX + "STORE") or None,
        control=env.get(PREFIX + "CONTROL") or None,
    )
