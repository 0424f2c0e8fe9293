"""The hooks' settings: `<hooks dir>/hooks.toml` (written by `hooks install`), per-node overrides, a few
environment variables, defaults.

A frozen dataclass rather than the project's pydantic model: the HealthCheckProgram may start every
second on every node, and this keeps its start-up to the standard library. The file is read as root, so
when the hook runs as root it must be owned by root and writable by nobody else, or it is ignored.

    cache_dir = "/dev/shm/slurm-elastic"   # %n: node name, %h: host name
    min_free_shm_mb = 256
    [node.n3]                               # overrides for one node
    min_free_shm_mb = 100
"""

from __future__ import annotations

import os
import socket
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from slurm_elastic.errors import ConfigError

__all__ = ["CONFIG_NAME", "HookSettings", "expand_node_path", "load_settings", "parse_settings"]

CONFIG_NAME = "hooks.toml"
ENV_HOOKS_DIR = "SLURM_ELASTIC_HOOKS_DIR"
ENV_CACHE_DIR = "SLURM_ELASTIC_CACHE_DIR"
_CHECK_GPUS = ("auto", "yes", "no")


@dataclass(frozen=True)
class HookSettings:
    # Node-local data cache of running jobs: <cache_dir>/<job id>/ (the epilog removes it).
    cache_dir: str = "/dev/shm/slurm-elastic"
    # SlurmdSpoolDir, for its free space; "auto" asks `scontrol show config`.
    spool_dir: str = "auto"
    log_dir: str = ""  # empty: syslog and stderr only
    state_dir: str = "/run/slurm-elastic"  # the health check's notification records and locks
    slurm_conf: str = ""  # exported as SLURM_CONF when Slurm gives the hook none (HealthCheckProgram)
    min_free_shm_mb: int = 256
    min_free_spool_mb: int = 256
    check_gpus: str = "auto"  # auto: where nvidia-smi exists
    expected_gpus: int = 0  # 0: whatever nvidia-smi lists, at least one
    notify_timeout_s: float = 2.0
    # The health check runs every HealthCheckInterval; its disk and GPU checks only this often.
    full_check_interval_s: float = 30.0
    # After its work, a health check run keeps watching its node's state for this long (0: not at all),
    # asking slurmctld every watch_every_s: a drain then reaches the job within about watch_every_s
    # instead of half a HealthCheckInterval. Costs one RPC per node per watch_every_s on slurmctld.
    watch_s: float = 0.0
    watch_every_s: float = 0.25
    # Undrain a node that passes its checks again, but only if a slurm-elastic hook drained it.
    resume_when_healthy: bool = True
    syslog: bool = True
    # Switches: turn one part off without editing slurm.conf.
    prolog: bool = True
    epilog_notify: bool = True
    epilog_cleanup: bool = True
    healthcheck_checks: bool = True
    healthcheck_notify: bool = True
    epilog_slurmctld_notify: bool = True

    def __post_init__(self) -> None:
        for name in ("min_free_shm_mb", "min_free_spool_mb", "expected_gpus"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} = {getattr(self, name)!r} must be 0 or more")
        for name in ("notify_timeout_s", "full_check_interval_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ConfigError(f"{name} = {getattr(self, name)!r} must be in (0, 3600] seconds")
        if not 0 <= self.watch_s <= 50:
            raise ConfigError(f"watch_s = {self.watch_s!r} must be in [0, 50] seconds (slurmd kills it at 60)")
        if not 0.05 <= self.watch_every_s <= 10:
            raise ConfigError(f"watch_every_s = {self.watch_every_s!r} must be in [0.05, 10] seconds")
        if self.check_gpus not in _CHECK_GPUS:
            raise ConfigError(f"check_gpus = {self.check_gpus!r}; valid: {', '.join(_CHECK_GPUS)}")
        for name in ("cache_dir", "state_dir", "log_dir", "slurm_conf", "spool_dir"):
            value = getattr(self, name)
            if value and value != "auto" and not value.startswith("/"):
                raise ConfigError(f"{name} = {value!r} must be an absolute path")
            if "\n" in value or "\x00" in value:
                raise ConfigError(f"{name} = {value!r} holds a newline or NUL")


_TYPES: dict[str, type] = {f.name: type(getattr(HookSettings(), f.name)) for f in fields(HookSettings)}


def _typed(key: str, value: Any, where: str) -> Any:
    if key not in _TYPES:
        raise ConfigError(f"{where}: unknown setting {key!r}; valid: {', '.join(sorted(_TYPES))}")
    want = _TYPES[key]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not want:
        raise ConfigError(f"{where}: {key} = {value!r} must be a {want.__name__}")
    return value


def parse_settings(data: Mapping[str, Any], node: str | None, where: str = CONFIG_NAME) -> HookSettings:
    """A parsed hooks.toml -> settings for `node`: top-level keys, then the `[node.<node>]` table."""
    top = {k: v for k, v in data.items() if k != "node"}
    per_node = data.get("node", {})
    if not isinstance(per_node, dict):
        raise ConfigError(f"{where}: `node` must be a table of per-node tables, got {per_node!r}")
    values = {k: _typed(k, v, where) for k, v in top.items()}
    for name, table in per_node.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [node.{name}] must be a table")
        if name == node:
            values.update({k: _typed(k, v, f"{where} [node.{name}]") for k, v in table.items()})
    return HookSettings(**values)


def _check_owner(path: Path, st: os.stat_result) -> None:
    # Root reads this file and acts on it: only root may be able to change it.
    if os.geteuid() == 0 and (st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise ConfigError(
            f"{path} must be owned by root and writable by root only "
            f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); ignored"
        )


def load_settings(
    hooks_dir: str | None, node: str | None, environ: Mapping[str, str]
) -> tuple[HookSettings, str | None]:
    """Settings for this run, and a warning when the file had to be ignored (defaults are used then)."""
    settings, warning = HookSettings(), None
    if hooks_dir:
        path = Path(hooks_dir) / CONFIG_NAME
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{path} is not a regular file; ignored")
            _check_owner(path, st)
            settings = parse_settings(tomllib.loads(path.read_text()), node, str(path))
        except FileNotFoundError:
            pass
        except (ConfigError, OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            warning = f"{path}: {exc}" if not isinstance(exc, ConfigError) else str(exc)
    cache = environ.get(ENV_CACHE_DIR)
    if cache:
        try:
            settings = replace(settings, cache_dir=cache)
        except ConfigError as exc:
            warning = f"{ENV_CACHE_DIR}: {exc}"
    return settings, warning


def expand_node_path(template: str, node: str | None) -> str:
    """`%n` -> the node name, `%h` -> the host name, `%%` -> `%` (as in SlurmdSpoolDir)."""
    out, i = [], 0
    while i < len(template):
        ch = template[i]
        nxt = template[i + 1] if i + 1 < len(template) else ""
        if ch == "%" and nxt in ("n", "h", "%"):
            out.append({"n": node or socket.gethostname(), "h": socket.gethostname(), "%": "%"}[nxt])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)
