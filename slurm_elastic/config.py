"""One configuration model and one resolver: command line > SLURM_ELASTIC_* environment > file > default."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_elastic.agentspec import DRAIN_GRACE_S, HEARTBEAT_INTERVAL_S, LEASE_TIMEOUT_S, MAX_RESTARTS
from slurm_elastic.errors import ConfigError

ENV_PREFIX = "SLURM_ELASTIC_"


class JobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]{1,100}$")
    nodes: int = Field(default=1, ge=1, le=100_000)
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    min_nodes: int | None = Field(default=None, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    heartbeat_interval_s: float = Field(default=HEARTBEAT_INTERVAL_S, gt=0)
    lease_timeout_s: float = Field(default=LEASE_TIMEOUT_S, gt=0)
    hang_timeout_s: float = Field(default=60.0, gt=0)
    rendezvous_timeout_s: float = Field(default=300.0, gt=0)
    pg_timeout_s: float = Field(default=60.0, gt=0)
    max_restarts: int = Field(default=MAX_RESTARTS, ge=0)
    max_relaunches: int = Field(default=3, ge=0)  # Slurm: new agents in a row on a node that came back
    max_identical_failures: int = Field(default=3, ge=1)
    recovery: Literal["in_process", "restart", "requeue"] = "in_process"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    drain_grace_s: float = Field(default=DRAIN_GRACE_S, gt=0)
    progress_interval_s: float = Field(default=10.0, gt=0)
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    checkpoint_dir: Path | None = None
    checkpoint_every: int = Field(default=0, ge=0)
    checkpoint_keep: int = Field(default=2, ge=1)  # disaster-recovery checkpoints kept (the newest ones)
    ledger_dir: Path | None = None
    node_watch_interval_s: float = Field(default=5.0, gt=0)
    requeue: bool = True
    record_commits: bool = False  # one `commit` record per step in events.jsonl (benchmarks, tests)
    # How workers sum gradients (None: the library's default, or what the training script passes).
    reduce_dtype: Literal["float32", "bfloat16", "float64"] | None = None
    bucket_mb: float | None = Field(default=None, gt=0)
    prefetch: int | None = Field(default=None, ge=0)  # micro-batches read ahead per worker

    @property
    def expected_workers(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def min_workers(self) -> int:
        return (self.min_nodes or self.nodes) * self.nproc_per_node


def training_env(cfg: JobConfig) -> dict[str, str]:
    """The job's settings that its training processes read from their environment."""
    env: dict[str, str] = {"SLURM_ELASTIC_LOG_FORMAT": cfg.log_format}
    if cfg.ledger_dir:
        env["SLURM_ELASTIC_LEDGER_DIR"] = str(cfg.ledger_dir)
    if cfg.checkpoint_keep != 2:
        env[ENV_PREFIX + "CHECKPOINT_KEEP"] = str(cfg.checkpoint_keep)
    for name in ("reduce_dtype", "bucket_mb", "prefetch"):
        value = getattr(cfg, name)
        if value is not None:
            env[ENV_PREFIX + name.upper()] = str(value)
    return env


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _from_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    table = data.get("slurm_elastic", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [slurm_elastic] must be a table")
    return table


def resolve_config(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    file: Path | None = None,
) -> JobConfig:
    """Merge the layers; a bad value gives a one-line ConfigError naming the field, value, source and valid ones."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if file is not None:
        layers.append((f"config file {file}", _from_file(file)))
    if env:
        fields = JobConfig.model_fields
        layers.append(
            ("environment", {k: env[ENV_PREFIX + k.upper()] for k in fields if ENV_PREFIX + k.upper() in env})
        )
    if cli:
        layers.append(("command line", {k: v for k, v in cli.items() if v is not None}))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source, values in layers:
        merged.update(values)
        origin.update(dict.fromkeys(values, source))
    try:
        return JobConfig.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "?"
        source = origin.get(name, "config")
        named = {"command line": _flag(name), "environment": ENV_PREFIX + name.upper()}
        where = named.get(source, f"{name} in {source}")
        if err["type"] == "extra_forbidden":
            valid = ", ".join(JobConfig.model_fields)
            raise ConfigError(f"unknown setting {name!r} in {source} (valid: {valid})") from None
        raise ConfigError(f"invalid {where}: {err.get('input')!r} ({err['msg'][0].lower()}{err['msg'][1:]})") from None
