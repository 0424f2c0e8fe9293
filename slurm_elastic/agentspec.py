"""How a node agent is started: its command line, written by the launchers and read by the agent, and
the defaults of the settings it shares with the coordinator and the job's configuration.

One type writes the command line (`to_argv`) and reads it (`from_argv`), so the launchers and the agent
cannot disagree on a flag or a default. A satellite's agent is started with `--join CORE_JOB` (see
sbatch_templates/elastic_satellite.sbatch): it reads the rest from the core job's directory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

# The defaults every part of a job agrees on (JobConfig, CoordinatorConfig, the coordinator's Welcome,
# a satellite's LaunchInfo): changed here, changed everywhere.
HEARTBEAT_INTERVAL_S = 1.0
LEASE_TIMEOUT_S = 10.0  # the coordinator silent this long: it is gone
DRAIN_GRACE_S = 60.0
MAX_RESTARTS = 3

PROG = "slurm-elastic agent"


@dataclass(frozen=True)
class AgentLaunch:
    """The agent's command line, as values. `join` (a satellite) or `coordinator` and `job_id`."""

    command: tuple[str, ...] = ()
    coordinator: str | None = None
    job_id: str | None = None
    join: str | None = None
    node: str | None = None  # default: SLURMD_NODENAME or the host name
    nproc: int = 1
    max_restarts: int = MAX_RESTARTS
    drain_grace_s: float = DRAIN_GRACE_S
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    lease_timeout_s: float = LEASE_TIMEOUT_S
    requeue_on_coordinator_loss: bool = False
    python: str = field(default=sys.executable, compare=False)  # the interpreter that runs it

    def problem(self) -> str | None:
        """What is wrong with these values, in one line naming the value and what is valid; None if nothing."""
        if self.join is not None:
            if self.coordinator is not None or self.job_id is not None:
                return "--join takes the coordinator and the job id from the core job: give no --coordinator, --job-id"
        elif not (self.coordinator and self.job_id and self.command):
            return "--coordinator, --job-id and a command after -- are required (or --join CORE_JOB)"
        if self.nproc < 1:
            return f"--nproc {self.nproc} is invalid: at least 1"
        if self.max_restarts < 0:
            return f"--max-restarts {self.max_restarts} is invalid: 0 or more"
        for name in ("drain_grace_s", "heartbeat_interval_s", "lease_timeout_s"):
            if not getattr(self, name) > 0:
                return f"{_flag(name)} {getattr(self, name)} is invalid: more than 0 seconds"
        return None

    def to_argv(self) -> list[str]:
        """`python -m slurm_elastic.agent ...`: the settings that differ from the defaults, then `-- command`."""
        problem = self.problem()
        if problem:
            raise ValueError(problem)
        argv = [self.python, "-m", "slurm_elastic.agent"]
        for name in _SETTINGS:
            value = getattr(self, name)
            if value != _DEFAULTS[name]:
                argv += [_flag(name)] if isinstance(value, bool) else [_flag(name), str(value)]
        return [*argv, *(["--", *self.command] if self.command else [])]

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> AgentLaunch:
        """The agent's own arguments (after `-m slurm_elastic.agent`). A bad one: a one-line error naming it,
        and exit code 2 (argparse)."""
        parser = _parser()
        args = parser.parse_args(list(argv))
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        launch = cls(command=tuple(command), **{name: getattr(args, name) for name in _SETTINGS})
        problem = launch.problem()
        if problem:
            parser.error(problem)
        return launch


_DEFAULTS = {f.name: f.default for f in fields(AgentLaunch)}
_SETTINGS = [name for name in _DEFAULTS if name not in ("command", "python")]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--coordinator", help="HOST:PORT of the job's coordinator")
    p.add_argument("--job-id")
    p.add_argument("--join", metavar="CORE_JOB", help="join the running job CORE_JOB as extra capacity (satellite)")
    p.add_argument("--node", help="node name (default: SLURMD_NODENAME or the host name)")
    p.add_argument("--nproc", type=int)
    p.add_argument("--max-restarts", type=int)
    p.add_argument("--drain-grace-s", type=float)
    p.add_argument("--heartbeat-interval-s", type=float)
    p.add_argument("--lease-timeout-s", type=float)
    p.add_argument(
        "--requeue-on-coordinator-loss", action="store_true", help="requeue the Slurm job if its coordinator vanishes"
    )
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(**{name: _DEFAULTS[name] for name in _SETTINGS})  # one source of defaults: the dataclass
    return p


class AgentSettings(Protocol):
    """What a job's configuration (config.JobConfig) gives each of its agents."""

    @property
    def nproc_per_node(self) -> int: ...
    @property
    def max_restarts(self) -> int: ...
    @property
    def drain_grace_s(self) -> float: ...
    @property
    def heartbeat_interval_s(self) -> float: ...
    @property
    def lease_timeout_s(self) -> float: ...


def agent_launch(settings: AgentSettings, command: Sequence[str], **given: Any) -> AgentLaunch:
    """An agent of a job with these settings, running `command`; `given`: the rest (coordinator, job id...)."""
    return AgentLaunch(
        command=tuple(command),
        nproc=settings.nproc_per_node,
        max_restarts=settings.max_restarts,
        drain_grace_s=settings.drain_grace_s,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        lease_timeout_s=settings.lease_timeout_s,
        **given,
    )
