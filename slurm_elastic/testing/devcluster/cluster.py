"""`LocalCluster`: start, stop, inspect and break a Slurm cluster of several slurmds on this machine."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from slurm_elastic.testing.devcluster import hostnet, procs, system
from slurm_elastic.testing.devcluster.conf import (
    ClusterConf,
    Hooks,
    SlurmVersion,
    node_names,
    render_cgroup_conf,
    render_slurm_conf,
)
from slurm_elastic.testing.devcluster.layout import Layout, default_state_dir
from slurm_elastic.testing.devcluster.shell import ClusterError, find_binary, run, start_daemon, tail
from slurm_elastic.testing.devcluster.sockets import TcpSocket, tcp_sockets
from slurm_elastic.testing.devcluster.unkillable import UNKILLABLE_STEP_PROGRAM
from slurm_elastic.waiting import WaitTimedOut, holds_within, wait_until

__all__ = ["ENV_NETWORK", "NETWORKS", "LocalCluster"]

# How the nodes are networked: "hosts" (default), each node a network namespace with addresses of its own
# (needs root), or "loopback", every node on 127.0.0.1 as one host.
ENV_NETWORK = "SLURM_ELASTIC_CLUSTER_NETWORK"
NETWORKS = ("hosts", "loopback")

# sinfo states in which a node takes no new work; a trailing '*' means "not responding".
_UNUSABLE = ("down", "drain", "fail", "unknown", "inval", "future", "maint", "reboot", "power")


def _usable(state: str) -> bool:
    return not state.endswith("*") and not any(state.startswith(bad) for bad in _UNUSABLE)


def _network_mode(network: str | None) -> str:
    mode = network or os.environ.get(ENV_NETWORK) or "hosts"
    if mode not in NETWORKS:
        raise ClusterError(f"{ENV_NETWORK}={mode!r} is not a network mode; use one of: {', '.join(NETWORKS)}")
    return mode


def _port_offset() -> int:
    # A port offset lets a second cluster (another state dir) run beside the first on one machine.
    raw = os.environ.get("SLURM_ELASTIC_CLUSTER_PORT_OFFSET", "0") or "0"
    try:
        return int(raw)
    except ValueError:
        raise ClusterError(f"SLURM_ELASTIC_CLUSTER_PORT_OFFSET={raw!r} is not an integer") from None


class LocalCluster:
    """A Slurm cluster of `node_count` slurmds (n1..nN), kept under `state_dir`: each node a host of its own
    (network "hosts": a network namespace with a management and a fabric address, see hostnet) or all of
    them on 127.0.0.1 (network "loopback").

    `up()` installs what is missing, writes slurm.conf and starts munged, slurmctld and the slurmds;
    `down()` stops all of them and every job process they started. Both are idempotent.
    Use `env()` (or `command_env()`) so that sinfo, sbatch and srun reach this cluster.
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        node_count: int = 4,
        startup_timeout_s: float = 60.0,
        network: str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else default_state_dir()
        self.layout = Layout(self.state_dir)
        self.nodes = node_names(node_count)
        self.startup_timeout_s = startup_timeout_s
        self.network = _network_mode(network)
        self.net = hostnet.HostNetwork(self.nodes, index=_port_offset() % 250) if self.network == "hosts" else None

    @property
    def slurm_conf_path(self) -> Path:
        return self.layout.slurm_conf

    def env(self) -> dict[str, str]:
        """The variables that point Slurm's commands at this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf_path)}

    def command_env(self) -> dict[str, str]:
        """This process's environment with `env()` applied: pass it to subprocesses."""
        return {**os.environ, **self.env()}

    def slurm(self, *argv: str, timeout_s: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (`cluster.slurm('sinfo', '-N')`) against this cluster."""
        binary = find_binary(argv[0]) or argv[0]
        return run(
            [binary, *argv[1:]], timeout_s=timeout_s, env=self.command_env(), check=check, log=self.layout.ctld_log
        )

    def config(self, version: SlurmVersion, hooks: Hooks | None = None) -> ClusterConf:
        offset = _port_offset()
        return ClusterConf(
            state_dir=self.state_dir,
            version=version,
            node_count=len(self.nodes),
            hooks=hooks or Hooks(),
            ctld_port=16817 + offset,
            slurmd_base_port=17001 + offset,
            network=self.net,
        )

    # --- state -----------------------------------------------------------------------------------

    def node_states(self) -> dict[str, str]:
        """sinfo's state of each node ('idle', 'mixed', 'down*', ...); empty when the controller is away."""
        result = self.slurm("sinfo", "-h", "-N", "-o", "%N %T", timeout_s=15.0, check=False)
        if result.returncode != 0:
            return {}
        states = {}
        for line in result.stdout.splitlines():
            name, _, state = line.strip().partition(" ")
            if name:
                states[name] = state.strip()
        return states

    def _daemons(self) -> tuple[set[int], dict[str, set[int]]]:
        table = procs.list_procs()
        return self.layout.controller_pids(table), {n: self.layout.slurmd_pids(table, n) for n in self.nodes}

    def is_up(self) -> bool:
        """The controller answers and every node's slurmd runs."""
        if not self.slurm_conf_path.is_file():
            return False
        ctld, slurmds = self._daemons()
        if not ctld or not all(slurmds.values()):
            return False
        return self.slurm("sinfo", "-h", "-o", "%P", timeout_s=15.0, check=False).returncode == 0

    def status(self) -> str:
        """A short human summary: 'not running', or sinfo and squeue (and which slurmds are missing)."""
        ctld, slurmds = self._daemons()
        if not self.slurm_conf_path.is_file() or not ctld:
            return f"local Slurm cluster ({self.state_dir}): not running"
        missing = [node for node, pids in slurmds.items() if not pids]
        health = f"degraded, no slurmd for {', '.join(missing)}" if missing else "up"
        sinfo = self.slurm("sinfo", timeout_s=15.0, check=False)
        squeue = self.slurm("squeue", timeout_s=15.0, check=False).stdout.rstrip()
        head = f"local Slurm cluster ({self.state_dir}, {self.describe_network()})"
        if sinfo.returncode != 0:
            return f"{head}: slurmctld runs but does not answer; see {self.layout.ctld_log}"
        return f"{head}: {health}, SLURM_CONF={self.slurm_conf_path}\n{sinfo.stdout.rstrip()}\n{squeue}"

    def describe_network(self) -> str:
        if self.net is None:
            return "every node on 127.0.0.1"
        hosts = ", ".join(f"{n} {self.net.address(n)}" for n in self.nodes)
        return f"nodes as hosts: {hosts}; controller {self.net.controller_address}"

    @property
    def controller_address(self) -> str:
        """Where the nodes reach this machine outside them (slurmctld; a test's own coordinator)."""
        return self.net.controller_address if self.net is not None else "127.0.0.1"

    def address(self, node: str, net: str = "mgmt") -> str:
        """`node`'s address on network `net` ("mgmt" or "fab"); 127.0.0.1 when every node is on loopback."""
        self._check_node(node)
        return self.net.address(node, net) if self.net is not None else "127.0.0.1"

    # --- up / down -------------------------------------------------------------------------------

    def up(self, hooks_dir: Path | str | None = None) -> bool:
        """Bring the cluster up (hooks from `hooks_dir` if given); True when something had to start."""
        if self.layout.socket_path_too_long():
            raise ClusterError(f"state dir {str(self.state_dir)!r} is too long for Slurm's Unix sockets; use --dir")
        self.layout.log_dir.mkdir(parents=True, exist_ok=True)
        system.ensure_packages(self.layout.log_dir)
        hooks = Hooks.from_dir(Path(hooks_dir)) if hooks_dir is not None else Hooks()
        conf = self.config(system.slurm_version(), hooks)
        slurm_conf = render_slurm_conf(conf)
        started_munge = system.ensure_munge(self.state_dir)
        ctld, slurmds = self._daemons()
        same_conf = self.slurm_conf_path.is_file() and self.slurm_conf_path.read_text() == slurm_conf
        if ctld and same_conf:
            missing = [node for node, pids in slurmds.items() if not pids]
            for node in missing:
                self._start_slurmd(node)
            if missing:
                self.wait_nodes(missing, timeout_s=self.startup_timeout_s)
            return bool(missing) or started_munge
        try:
            if ctld or any(slurmds.values()):
                self._stop_slurm()  # a different config, or a half-stopped cluster: start afresh
            self._write_config(conf, slurm_conf)
            if self.net is not None:
                if os.geteuid() != 0:
                    raise ClusterError(f"nodes as separate hosts need root; run as root or set {ENV_NETWORK}=loopback")
                hostnet.create(self.net)
            self._start_controller()
            for node in self.nodes:
                self._start_slurmd(node)
            self.wait_nodes(self.nodes, want_idle=True, timeout_s=self.startup_timeout_s)
        except BaseException:
            self.down()  # CI runs `up` without a `down` after it fails: leave nothing behind
            raise
        return True

    def down(self) -> None:
        """Stop every process of the cluster, and munged if `up` started it; remove its host network.
        Keeps logs and config."""
        self._stop_slurm()
        system.stop_munge(self.state_dir)
        if find_binary("ip") is not None and os.geteuid() == 0:  # also what a "hosts" run before left
            hostnet.remove(self.net or hostnet.HostNetwork(self.nodes, index=_port_offset() % 250))

    def _stop_slurm(self) -> None:
        # Rescan: a dying slurmd or slurmstepd may still start an epilog or report to a new process.
        for _ in range(3):
            pids = self.layout.cluster_pids(self.nodes)
            if not pids:
                return
            procs.terminate(pids, grace_s=5.0, kill_wait_s=5.0)
        left = self.layout.cluster_pids(self.nodes)
        if left:
            raise ClusterError(f"processes {sorted(left)} survived SIGKILL; see {self.layout.log_dir}")

    def _write_config(self, conf: ClusterConf, slurm_conf: str) -> None:
        # A fresh start: saved jobs would point at processes that no longer exist.
        for directory in (self.layout.save_dir, self.layout.spool_root):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        for node in self.nodes:
            self.layout.spool(node).mkdir()
        self.slurm_conf_path.write_text(slurm_conf)
        program = self.layout.unkillable_program
        program.write_text(UNKILLABLE_STEP_PROGRAM.replace("@LOG_DIR@", shlex.quote(str(self.layout.log_dir))))
        program.chmod(0o755)
        cgroup_conf = render_cgroup_conf(conf.version)
        if cgroup_conf is None:
            self.layout.cgroup_conf.unlink(missing_ok=True)
        else:
            self.layout.cgroup_conf.write_text(cgroup_conf)

    def _daemon_env(self) -> dict[str, str]:
        # A job's SLURM_* variables (when `up` runs inside a job) must not leak into the daemons.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        return {**env, **self.env()}

    def _start_controller(self) -> None:
        log = self.layout.ctld_log
        binary = find_binary("slurmctld") or "slurmctld"
        start_daemon(
            [binary, "-f", str(self.slurm_conf_path)],
            out=self.layout.log_dir / "slurmctld.out",
            env=self._daemon_env(),
            log=log,
        )
        missing_since: float | None = None

        def died() -> str | None:
            # slurmctld daemonizes: for a moment no process matches. Only a lasting absence means it died.
            nonlocal missing_since
            if self.layout.controller_pids(procs.list_procs()):
                missing_since = None
            elif missing_since is None:
                missing_since = time.monotonic()
            return "it is gone" if missing_since is not None and time.monotonic() - missing_since > 3.0 else None

        def answers() -> bool:
            return self.slurm("scontrol", "ping", timeout_s=15.0, check=False).returncode == 0

        try:
            wait_until(answers, timeout=self.startup_timeout_s, what="slurmctld", poll=0.5, give_up=died)
        except WaitTimedOut:
            raise ClusterError(f"slurmctld did not come up; see {log}", tail(log)) from None

    def _start_slurmd(self, node: str) -> None:
        binary = find_binary("slurmd") or "slurmd"
        on_node = self.net.exec_prefix(node) if self.net is not None else []
        start_daemon(
            [*on_node, binary, "-f", str(self.slurm_conf_path), "-N", node],
            out=self.layout.log_dir / f"slurmd.{node}.out",
            env=self._daemon_env(),
            log=self.layout.slurmd_log(node),
        )

    def wait_nodes(
        self, nodes: tuple[str, ...] | list[str], *, want_idle: bool = False, timeout_s: float = 60.0
    ) -> None:
        """Wait until each node responds and takes work (idle, with want_idle); raise with the log tail."""
        states: dict[str, str] = {}

        def waiting() -> list[str]:
            states.clear()
            states.update(self.node_states())
            return [n for n in nodes if not (states.get(n) == "idle" if want_idle else _usable(states.get(n, "down")))]

        if holds_within(lambda: not waiting(), timeout=timeout_s, poll=0.5):
            return
        left = waiting()
        if not left:  # up just now
            return
        dead = not self.layout.slurmd_pids(procs.list_procs(), left[0])
        log = self.layout.slurmd_log(left[0]) if dead or states else self.layout.ctld_log
        shown = ", ".join(f"{n}={states.get(n, '?')}" for n in left)
        raise ClusterError(
            f"nodes not {'idle' if want_idle else 'up'} after {timeout_s:g} s ({shown}); see {log}", tail(log)
        )

    def recover_nodes(self, timeout_s: float = 60.0) -> list[tuple[str, str, str]]:
        """Bring back every node that is drained, down or failed (its slurmd restarted if it died, then
        RESUME); returns (node, state, Slurm's reason) of each, so the caller can report what it found."""
        result = self.slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E", timeout_s=15.0, check=False)
        found = []
        for line in result.stdout.splitlines():
            name, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if name in self.nodes and not _usable(state) and (name, state, reason) not in found:
                found.append((name, state, reason))
        for name, _, _ in found:
            if not self.layout.slurmd_pids(procs.list_procs(), name):
                self._start_slurmd(name)
            self.slurm("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
        if found:
            self.wait_nodes([n for n, _, _ in found], timeout_s=timeout_s)
        return found

    def task_sockets(self, node: str, table: list[procs.Proc] | None = None) -> dict[int, tuple[str, list[TcpSocket]]]:
        """The TCP sockets of every job task on `node` (not Slurm's own daemons): pid -> (command, sockets)."""
        self._check_node(node)
        table = table if table is not None else procs.list_procs()
        by_pid = {p.pid: p for p in table}
        found = {}
        for pid in sorted(self.layout.node_pids(node, table)):
            proc = by_pid.get(pid)
            if proc is None or proc.name.startswith(("slurmd", "slurmstepd")):
                continue
            found[pid] = (" ".join(proc.argv)[:200], tcp_sockets(pid))
        return found

    def loopback_task_sockets(self) -> list[tuple[str, str, TcpSocket]]:
        """(node, command, socket) for each socket of a job task bound to or connected through loopback."""
        table = procs.list_procs()
        return [
            (node, cmd, sock)
            for node in self.nodes
            for cmd, sockets in self.task_sockets(node, table).values()
            for sock in sockets
            if sock.on_loopback
        ]

    # --- failure simulation ----------------------------------------------------------------------

    def set_link(self, node: str, up: bool, net: str = "mgmt") -> None:
        """Cut `node` off network `net` ("mgmt" or "fab") or connect it again: a partition, not a crash."""
        self._check_node(node)
        if self.net is None:
            raise ClusterError(f"no link to cut: every node is on 127.0.0.1 ({ENV_NETWORK}=loopback)")
        hostnet.set_link(self.net, node, up, net)

    def set_route(self, node: str, peer: str, blocked: bool, net: str = "mgmt") -> None:
        """Cut what `node` sends to `peer` on network `net`, or mend it: both still reach everyone else."""
        self._check_node(node)
        self._check_node(peer)
        if self.net is None:
            raise ClusterError(f"no route to cut: every node is on 127.0.0.1 ({ENV_NETWORK}=loopback)")
        hostnet.set_route(self.net, node, peer, blocked, net)

    def kill_node(self, name: str, *, mark_down: bool = False) -> set[int]:
        """Simulate the sudden death of node `name`: SIGKILL its slurmd, its slurmstepds and their tasks at once.

        The controller notices only after SlurmdTimeout, as with a real node; `mark_down` tells it at once.
        Returns the pids killed.
        """
        self._check_node(name)
        pids = self.layout.node_pids(name)
        left = procs.kill_at_once(pids)
        left |= procs.kill_at_once(self.layout.node_pids(name))  # a task forked while we stopped the rest
        if left:
            raise ClusterError(f"node {name}: processes {sorted(left)} survived SIGKILL")
        if mark_down:
            self.slurm("scontrol", "update", f"NodeName={name}", "State=DOWN", "Reason=kill_node")
        return pids

    def restart_node(self, name: str, *, timeout_s: float = 60.0) -> None:
        """Start node `name`'s slurmd again (if it is not running) and wait until the node takes work."""
        self._check_node(name)
        if not self.layout.slurmd_pids(procs.list_procs(), name):
            self._start_slurmd(name)
        self.wait_nodes([name], timeout_s=timeout_s)

    def _check_node(self, name: str) -> None:
        if name not in self.nodes:
            raise ClusterError(f"unknown node {name!r}; the nodes are {', '.join(self.nodes)}")
