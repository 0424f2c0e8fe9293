"""Where a local cluster keeps its files, and which running processes belong to it.

A process belongs to the cluster when it is
- a slurmctld or slurmd started with `-f <this slurm.conf>` (and `-N <node>` for a slurmd);
- a slurmstepd that holds a Unix socket in a node's spool dir or has that node's slurmd log open
  (slurmstepd clears its environment and is re-parented to init, so neither env nor parent tells);
- a descendant of those (job tasks, prolog/epilog, slurmscriptd);
- a job task that escaped its parent (setsid, double fork) but whose environment still says
  SLURM_CONF=<this slurm.conf> and SLURMD_NODENAME=<node> and carries a SLURM_JOB_ID.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.testing.devcluster import procs
from slurm_elastic.testing.devcluster.procs import Proc

__all__ = ["ENV_STATE_DIR", "Layout", "default_state_dir"]

ENV_STATE_DIR = "SLURM_ELASTIC_CLUSTER_DIR"
# sun_path holds 107 characters; slurmstepd binds <spool>/<node>/<node>_<jobid>.<stepid>.
_MAX_SOCKET_PATH = 107
_SOCKET_NAME_ROOM = len("/n99/n99_9999999.4294967291")


def default_state_dir() -> Path:
    """$SLURM_ELASTIC_CLUSTER_DIR, else <repo root>/.cluster (the checkout holding this package), else ./.cluster."""
    from_env = os.environ.get(ENV_STATE_DIR)
    if from_env:
        return Path(from_env).resolve()
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file() and (repo / "slurm_elastic").is_dir():
        return repo / ".cluster"
    return Path.cwd().resolve() / ".cluster"


def _arg_after(argv: tuple[str, ...], flag: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


@dataclass(frozen=True)
class Layout:
    state_dir: Path

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def cgroup_conf(self) -> Path:
        return self.state_dir / "cgroup.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def unkillable_program(self) -> Path:
        """Run by slurmstepd when a step outlives SIGKILL: writes what was left to `unkillable_reports`."""
        return self.state_dir / "unkillable-step"

    def unkillable_reports(self) -> list[Path]:
        return sorted(self.log_dir.glob("unkillable-*.txt"))

    def slurmd_logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("slurmd.*.log"))

    @property
    def save_dir(self) -> Path:
        return self.state_dir / "state"

    @property
    def spool_root(self) -> Path:
        return self.state_dir / "spool"

    @property
    def ctld_log(self) -> Path:
        return self.log_dir / "slurmctld.log"

    @property
    def ctld_pid_file(self) -> Path:
        return self.state_dir / "slurmctld.pid"

    def spool(self, node: str) -> Path:
        return self.spool_root / node

    def slurmd_log(self, node: str) -> Path:
        return self.log_dir / f"slurmd.{node}.log"

    def slurmd_pid_file(self, node: str) -> Path:
        return self.state_dir / f"slurmd.{node}.pid"

    def socket_path_too_long(self) -> bool:
        return len(str(self.spool_root)) + _SOCKET_NAME_ROOM > _MAX_SOCKET_PATH

    # --- processes -------------------------------------------------------------------------------

    def _started_with_conf(self, proc: Proc, name: str) -> bool:
        return proc.name == name and _arg_after(proc.argv, "-f") == str(self.slurm_conf)

    def controller_pids(self, table: Iterable[Proc]) -> set[int]:
        return {p.pid for p in table if self._started_with_conf(p, "slurmctld") and procs.alive(p.pid)}

    def slurmd_pids(self, table: Iterable[Proc], node: str) -> set[int]:
        return {
            p.pid
            for p in table
            if self._started_with_conf(p, "slurmd") and _arg_after(p.argv, "-N") == node and procs.alive(p.pid)
        }

    def stepd_pids(self, table: Iterable[Proc], node: str) -> set[int]:
        stepds = {p.pid for p in table if p.name.startswith("slurmstepd") and procs.alive(p.pid)}
        if not stepds:
            return set()
        holders = procs.unix_socket_pids(self.spool(node)) | procs.open_file_pids(self.slurmd_log(node))
        return stepds & holders

    def escaped_task_pids(self, table: Iterable[Proc], nodes: Iterable[str]) -> set[int]:
        wanted = set(nodes)
        conf = str(self.slurm_conf)
        found = set()
        for p in table:
            env = procs.read_environ(p.pid)
            if env.get("SLURM_CONF") == conf and env.get("SLURMD_NODENAME") in wanted and "SLURM_JOB_ID" in env:
                found.add(p.pid)
        return found

    def node_pids(self, node: str, table: list[Proc] | None = None) -> set[int]:
        """The slurmd of `node`, its step daemons, and every job task and hook running there."""
        table = table if table is not None else procs.list_procs()
        roots = self.slurmd_pids(table, node) | self.stepd_pids(table, node)
        found = roots | procs.descendants(table, roots) | self.escaped_task_pids(table, [node])
        return {pid for pid in found if procs.alive(pid)} - procs.protected_pids()

    def cluster_pids(self, nodes: Iterable[str]) -> set[int]:
        """Every process of the cluster: controller, all nodes, their steps and tasks."""
        table = procs.list_procs()
        ctld = self.controller_pids(table)
        found = ctld | procs.descendants(table, ctld)
        for node in nodes:
            found |= self.node_pids(node, table)
        # A slurmd of a node no longer in slurm.conf (node count changed) still belongs to us.
        found |= {p.pid for p in table if self._started_with_conf(p, "slurmd") and procs.alive(p.pid)}
        return found - procs.protected_pids()
