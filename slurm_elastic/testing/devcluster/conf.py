"""Render the local cluster's slurm.conf and cgroup.conf: pure functions of a `ClusterConf`.

Nothing here touches the machine except `Hooks.from_dir`, which only looks at which hook files exist.
The Slurm version decides the few lines that differ between Debian 12 (22.05) and Debian 13 (24.11).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from slurm_elastic.errors import SlurmError
from slurm_elastic.slurm.records import SlurmVersion
from slurm_elastic.testing.devcluster.hostnet import HostNetwork

__all__ = [
    "HOOK_NAMES",
    "ClusterConf",
    "Hooks",
    "SlurmVersion",
    "node_names",
    "render_cgroup_conf",
    "render_slurm_conf",
]

# File names that `up --hooks DIR` looks for, mapped to the Hooks field they fill.
HOOK_NAMES: dict[str, str] = {
    "prolog": "prolog",
    "epilog": "epilog",
    "healthcheck": "healthcheck",
    "prolog_slurmctld": "prolog_slurmctld",
    "epilog_slurmctld": "epilog_slurmctld",
}


@dataclass(frozen=True)
class Hooks:
    """Absolute paths of the admin hooks to configure; None leaves a hook out."""

    prolog: Path | None = None
    epilog: Path | None = None
    healthcheck: Path | None = None
    prolog_slurmctld: Path | None = None
    epilog_slurmctld: Path | None = None
    # As `hooks install` advises: the smallest that works (with 1, 22.05's slurmctld never pings its nodes,
    # and a node resumed with scontrol stays NOT_RESPONDING).
    healthcheck_interval_s: int = 2
    # A hook can never hang a node for longer than this.
    timeout_s: int = 60

    def any(self) -> bool:
        return any(getattr(self, attr) is not None for attr in HOOK_NAMES.values())

    @classmethod
    def from_dir(cls, directory: Path, *, healthcheck_interval_s: int = 2, timeout_s: int = 60) -> Hooks:
        """The hooks present in `directory` (by file name, see HOOK_NAMES); each must be executable."""
        directory = directory.resolve()
        if not directory.is_dir():
            raise SlurmError(f"hooks directory {str(directory)!r} does not exist")
        found: dict[str, Path] = {}
        for name, attr in HOOK_NAMES.items():
            path = directory / name
            if not path.exists():
                continue
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise SlurmError(f"hook {str(path)!r} is not an executable file (chmod +x it)")
            found[attr] = path
        return cls(**found, healthcheck_interval_s=healthcheck_interval_s, timeout_s=timeout_s)


def node_names(count: int) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in range(1, count + 1))


@dataclass(frozen=True)
class ClusterConf:
    """Everything the rendered configuration depends on."""

    state_dir: Path
    version: SlurmVersion
    node_count: int = 4
    ctld_port: int = 16817
    slurmd_base_port: int = 17001
    cpus_per_node: int = 2
    real_memory_mb: int = 4000
    # Seconds a requeued job waits before it is eligible again (Slurm's default is 120).
    requeue_delay_s: int = 10
    slurmd_timeout_s: int = 30
    # Seconds between the scheduler's passes over pending jobs (main loop and backfill).
    sched_interval_s: int = 2
    grace_time_s: int = 5
    hooks: Hooks = field(default_factory=Hooks)
    cluster_name: str = "elastic"
    # Each node a host of its own (see hostnet); None: every node on 127.0.0.1.
    network: HostNetwork | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return node_names(self.node_count)

    def slurmd_port(self, node: str) -> int:
        return self.slurmd_base_port + self.nodes.index(node)


def _hook_lines(conf: ClusterConf) -> list[str]:
    hooks = conf.hooks
    if not hooks.any():
        return []
    lines = ["# Admin hooks (up --hooks DIR)"]
    if hooks.prolog is not None:
        lines.append(f"Prolog={hooks.prolog}")
    if hooks.epilog is not None:
        lines.append(f"Epilog={hooks.epilog}")
    if hooks.prolog_slurmctld is not None:
        lines.append(f"PrologSlurmctld={hooks.prolog_slurmctld}")
    if hooks.epilog_slurmctld is not None:
        lines.append(f"EpilogSlurmctld={hooks.epilog_slurmctld}")
    # Alloc: the prolog runs on every node when the job is allocated, not at its first step.
    lines.append("PrologFlags=Alloc")
    if conf.version >= SlurmVersion(25, 5):
        # 25.05 split the one timeout into two.
        lines += [f"PrologTimeout={hooks.timeout_s}", f"EpilogTimeout={hooks.timeout_s}"]
    else:
        lines.append(f"PrologEpilogTimeout={hooks.timeout_s}")
    if hooks.healthcheck is not None:
        lines += [f"HealthCheckProgram={hooks.healthcheck}", f"HealthCheckInterval={hooks.healthcheck_interval_s}"]
    return lines


def _controller(conf: ClusterConf) -> str:
    # The name must be this host's (or localhost); the address is where the nodes reach it.
    return f"localhost({conf.network.controller_address})" if conf.network else "localhost"


def render_slurm_conf(conf: ClusterConf) -> str:
    """slurm.conf for `conf.node_count` slurmds (each at its own address, or all on 127.0.0.1), one
    controller, partitions train and infer."""
    s = conf.state_dir
    if not s.is_absolute():
        raise SlurmError(f"state dir {str(s)!r} must be an absolute path")
    lines = [
        "# Generated by `python -m slurm_elastic.testing.devcluster up`; rewritten on every up.",
        f"# Slurm {conf.version}",
        f"ClusterName={conf.cluster_name}",
        f"SlurmctldHost={_controller(conf)}",
        f"SlurmctldPort={conf.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # cred_expire also sets how long a requeued job must wait before it may start again.
        f"AuthInfo=cred_expire={conf.requeue_delay_s}",
        f"StateSaveLocation={s / 'state'}",
        f"SlurmdSpoolDir={s / 'spool' / '%n'}",
        f"SlurmctldPidFile={s / 'slurmctld.pid'}",
        f"SlurmdPidFile={s / 'slurmd.%n.pid'}",
        f"SlurmctldLogFile={s / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={s / 'log' / 'slurmd.%n.log'}",
        # No cgroups: every node is the same machine, and a container may not let us create cgroups.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # Each slurmd reports this machine's hardware; trust slurm.conf so that no node is drained for it.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SlurmctldTimeout=30",
        f"SlurmdTimeout={conf.slurmd_timeout_s}",
        "InactiveLimit=0",
        "KillWait=5",
        # A step whose processes outlive SIGKILL drains its node ("Kill task failed"): record what was left.
        "UnkillableStepTimeout=60",
        f"UnkillableStepProgram={s / 'unkillable-step'}",
        # slurmstepd logs its teardown (output, task exit and completion messages) at debug and debug2.
        "SlurmdDebug=debug2",
        "MinJobAge=300",
        "JobRequeue=1",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        # Pass over pending jobs every few seconds, not every 30 s (backfill) / 60 s (main loop):
        # nothing else wakes the scheduler when a requeued job's BeginTime passes.
        f"SchedulerParameters=permit_job_expansion,bf_interval={conf.sched_interval_s},sched_interval={conf.sched_interval_s}",
    ]
    lines += _hook_lines(conf)
    net = conf.network
    lines.append(
        "# Nodes: one slurmd each, " + ("each in a network namespace of its own" if net else "all on 127.0.0.1")
    )
    for node in conf.nodes:
        addr = net.address(node) if net else "127.0.0.1"
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr={addr} Port={conf.slurmd_port(node)} "
            f"CPUs={conf.cpus_per_node} RealMemory={conf.real_memory_mb} State=UNKNOWN"
        )
    lines += [
        "# train is preemptible (requeued after GraceTime); infer preempts it and is never preempted",
        "PartitionName=train Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        f"GraceTime={conf.grace_time_s} PreemptMode=REQUEUE",
        "PartitionName=infer Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def render_cgroup_conf(version: SlurmVersion) -> str | None:
    """cgroup.conf, or None where the version needs none.

    From 23.02 slurmd initialises a cgroup plugin even with proctrack/linuxproc and task/none, and the
    cgroup/v2 one needs systemd over dbus, which a container (or slurmd started by hand) lacks.
    24.05 added CgroupPlugin=disabled; 22.05 runs without a cgroup.conf.
    """
    if version >= SlurmVersion(24, 5):
        return (
            "# Generated by slurm_elastic.testing.devcluster: no cgroup use on the local test cluster.\n"
            "CgroupPlugin=disabled\n"
        )
    if version >= SlurmVersion(23, 2):
        # No "disabled" yet: keep slurmd away from systemd (untested on these versions).
        return "# Generated by slurm_elastic.testing.devcluster.\nCgroupPlugin=autodetect\nIgnoreSystemd=yes\n"
    return None
