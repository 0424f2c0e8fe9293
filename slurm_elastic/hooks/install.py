"""`slurm-elastic hooks install`: copy the sh wrappers with this installation's values baked in, write a
starting hooks.toml, and say which slurm.conf lines to add.

The wrappers' four settings lines (SE_PYTHON, SE_TIMEOUT_S, SE_SLURM_BIN, SE_HOOKS_DIR) are replaced by
shell-quoted values, so an interpreter path with spaces or quotes stays one word; paths that slurm.conf
itself cannot carry (blanks, quotes, '#') are refused with a message naming them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.errors import ConfigError
from slurm_elastic.hooks import HOOK_MODULES
from slurm_elastic.hooks.settings import CONFIG_NAME

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "KILL_GRACE_S",
    "MIN_INTERVAL_S",
    "REQUIRED",
    "SETTING_KEYS",
    "InstallOptions",
    "bake",
    "install",
    "read_baked",
    "slurm_conf_lines",
    "source_dir",
    "watch_for",
]

REQUIRED = ("prolog", "epilog", "healthcheck")
SETTING_KEYS = ("SE_PYTHON", "SE_TIMEOUT_S", "SE_SLURM_BIN", "SE_HOOKS_DIR")
DEFAULT_TIMEOUT_S = 20
# Slurm takes HealthCheckInterval=1, but on 22.05 slurmctld then runs a health check on every pass of its
# background loop and never gets to ping the nodes: a node marked NOT_RESPONDING (as `scontrol update
# State=RESUME` does) is never taken back, and a dead one never marked DOWN. 2 is the smallest that works.
MIN_INTERVAL_S = 2
# The health check run watches its node until this long before the next run starts.
WATCH_MARGIN_S = 0.75
# The wrapper kills the Python part at SE_TIMEOUT_S, and hard 2 s later; Slurm's own bound must be larger.
KILL_GRACE_S = 2
# slurm.conf has no quoting for these values: refuse what it would split or cut.
_CONF_UNSAFE = re.compile(r"[\s#\"'=\\\x00-\x1f\x7f]")


def source_dir() -> Path:
    """The repository's `hooks/` directory next to this package (a source or editable installation)."""
    return Path(__file__).resolve().parents[2] / "hooks"


def _conf_path(what: str, path: Path) -> Path:
    if not path.is_absolute():
        raise ConfigError(f"{what} {str(path)!r} must be an absolute path")
    if _CONF_UNSAFE.search(str(path)):
        raise ConfigError(f"{what} {str(path)!r} holds a blank, quote, '#', '=' or '\\' that slurm.conf cannot carry")
    return path


def _check_python(python: Path) -> Path:
    # Not resolved: a virtualenv's python is a symlink whose target would lose the environment.
    if not python.is_absolute() or any(ord(ch) < 32 for ch in str(python)):
        raise ConfigError(f"--python {str(python)!r} must be an absolute path without control characters")
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise ConfigError(f"--python {str(python)!r} is not an executable file")
    return python


def bake(template: str, values: dict[str, str]) -> str:
    """Replace each `KEY=...` settings line of a wrapper by `KEY=<shell-quoted value>`."""
    lines = template.splitlines(keepends=True)
    for key, value in values.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(f"{key}=")]
        if len(hits) != 1:
            raise ConfigError(f"the hook template has {len(hits)} `{key}=` lines, expected exactly one")
        lines[hits[0]] = f"{key}={shlex.quote(value) if value else ''}\n"
    return "".join(lines)


def read_baked(text: str) -> dict[str, str]:
    """The settings lines of an installed wrapper, unquoted (for `hooks check`)."""
    found = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if sep and key in SETTING_KEYS and key not in found:
            try:
                words = shlex.split(raw)
            except ValueError:
                words = [raw]
            found[key] = words[0] if words else ""
    return found


@dataclass(frozen=True)
class InstallOptions:
    prefix: Path
    python: Path
    timeout_s: int = DEFAULT_TIMEOUT_S
    healthcheck_interval_s: int = MIN_INTERVAL_S
    watch_s: float | None = None  # default: the interval less WATCH_MARGIN_S
    slurm_conf: Path | None = None
    log_dir: Path | None = None  # default: <prefix>/log
    state_dir: Path | None = None  # default: /run/slurm-elastic
    cache_dir: str | None = None
    source: Path | None = None
    force_config: bool = False


def watch_for(opts: InstallOptions) -> float:
    if opts.watch_s is not None:
        return opts.watch_s
    return max(0.0, opts.healthcheck_interval_s - WATCH_MARGIN_S)


def _config_text(opts: InstallOptions) -> str:
    values: dict[str, str | float] = {"log_dir": str(opts.log_dir or opts.prefix / "log")}
    if opts.state_dir is not None:
        values["state_dir"] = str(opts.state_dir)
    if opts.cache_dir is not None:
        values["cache_dir"] = opts.cache_dir
    if opts.slurm_conf is not None:
        values["slurm_conf"] = str(opts.slurm_conf)
    body = "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())
    watch = (
        "# Each health check run watches its node's state this long, asking slurmctld every watch_every_s\n"
        "# (one RPC per node each time): a drain reaches the job in about 0.3 s instead of half an interval.\n"
        "# 0 on large clusters.\n"
        f"watch_s = {watch_for(opts)}\n"
    )
    return (
        "# slurm-elastic hooks settings (docs/admin-hooks.md). Read as root: keep it root-owned, mode 0644.\n"
        + body
        + watch
        + '# min_free_shm_mb = 256\n# min_free_spool_mb = 256\n# check_gpus = "auto"\n# expected_gpus = 0\n'
        + "# notify_timeout_s = 2.0\n# full_check_interval_s = 30.0\n# resume_when_healthy = true\n"
        + "# watch_every_s = 0.25\n"
        + "# Switches: prolog, epilog_notify, epilog_cleanup, healthcheck_checks, healthcheck_notify,\n"
        + "# epilog_slurmctld_notify (all true by default). Per node: [node.<name>] tables.\n"
    )


def slurm_conf_lines(
    prefix: Path, *, interval_s: int = MIN_INTERVAL_S, timeout_s: int = DEFAULT_TIMEOUT_S
) -> list[str]:
    """The slurm.conf lines that enable the hooks installed in `prefix` (Slurm up to 24.11)."""
    bound = max(60, timeout_s + KILL_GRACE_S + 10)
    return [
        f"Prolog={prefix / 'prolog'}",
        f"Epilog={prefix / 'epilog'}",
        "PrologFlags=Alloc",
        f"PrologEpilogTimeout={bound}",
        f"HealthCheckProgram={prefix / 'healthcheck'}",
        f"HealthCheckInterval={interval_s}",
        "# Optional: the controller's view of satellite jobs that end",
        f"#EpilogSlurmctld={prefix / 'epilog_slurmctld'}",
        "# Recommended: requeue a job whose Prolog failed on one node instead of holding it",
        "# (merge into your SchedulerParameters): SchedulerParameters=nohold_on_prolog_fail",
        "# Slurm 25.05+: PrologTimeout= and EpilogTimeout= instead of PrologEpilogTimeout=",
    ]


def install(opts: InstallOptions) -> list[str]:
    """Install into opts.prefix; returns one line per thing done."""
    prefix = _conf_path("--prefix", opts.prefix)
    python = _check_python(opts.python)
    if not 1 <= opts.timeout_s <= 300:
        raise ConfigError(f"--timeout {opts.timeout_s} must be between 1 and 300 seconds")
    if opts.healthcheck_interval_s < MIN_INTERVAL_S:
        raise ConfigError(
            f"--healthcheck-interval {opts.healthcheck_interval_s} must be at least {MIN_INTERVAL_S}: with 1, "
            "slurmctld (22.05) stops pinging nodes, so NOT_RESPONDING nodes never come back"
        )
    watch = watch_for(opts)
    if watch < 0 or (watch > 0 and watch > opts.timeout_s - 5):
        raise ConfigError(f"--watch {watch} must be 0, or at most --timeout less 5 s ({opts.timeout_s - 5})")
    source = opts.source or source_dir()
    missing = [name for name in HOOK_MODULES if not (source / name).is_file()]
    if missing:
        raise ConfigError(f"no hook scripts {missing} in {str(source)!r}; pass --source DIR (the repository's hooks/)")
    scontrol = shutil.which("scontrol")
    values = {
        "SE_PYTHON": str(python),
        "SE_TIMEOUT_S": str(opts.timeout_s),
        "SE_SLURM_BIN": str(Path(scontrol).parent) if scontrol else "",
        "SE_HOOKS_DIR": str(prefix),
    }
    done = []
    prefix.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name in HOOK_MODULES:
        target = prefix / name
        tmp = prefix / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        with os.fdopen(fd, "w") as fh:
            fh.write(bake((source / name).read_text(), values))
        os.chmod(tmp, 0o755)  # whatever the umask
        os.replace(tmp, target)
        done.append(f"installed {target}")
    config = prefix / CONFIG_NAME
    if config.exists() and not opts.force_config:
        done.append(f"kept {config} (--force-config replaces it)")
    else:
        config.write_text(_config_text(opts))
        os.chmod(config, 0o644)
        done.append(f"wrote {config}")
    return done
