"""The local cluster's nodes as separate hosts: a network namespace per node, on two bridges.

Each node gets a namespace of its own with two interfaces, `mgmt0` on the management bridge (the one
slurmctld, the coordinator and every control connection use) and `fab0` on a second, "fabric" bridge, so
that choosing the interface of the training groups is a real decision. The host side holds the bridges
and the controller's address on the management one. No namespace has a default route: a node reaches its
cluster's addresses and nothing else.

Each node also gets its own /etc/hosts (bound over the machine's in a mount namespace of the node's
slurmd) in which this machine's host name is the node's management address, as a real node's name
resolves to its own address; Slurm, the coordinator's default address and gloo's default device all
follow it.

`HostNetwork` is a pure plan (names, addresses, the `ip` commands); `create` and `remove` carry it out.
Both are idempotent, and `remove` also clears what a crashed run left, since every name it made starts
with the plan's prefix.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.testing.devcluster.shell import ClusterError, find_binary

__all__ = ["FABRIC_IF", "MGMT_IF", "HostNetwork", "create", "remove", "set_link", "set_route"]

MGMT_IF = "mgmt0"
FABRIC_IF = "fab0"
NETNS_ETC = Path("/etc/netns")
_NETS = {"mgmt": MGMT_IF, "fab": FABRIC_IF}


@dataclass(frozen=True)
class HostNetwork:
    """Names and addresses of a cluster's host network. `index` (0..249) keeps two clusters apart."""

    nodes: tuple[str, ...]
    index: int = 0

    @property
    def prefix(self) -> str:
        return "se" if self.index == 0 else f"se{self.index}"

    def subnet(self, net: str) -> str:
        return f"10.{77 if net == 'mgmt' else 78}.{self.index}"

    @property
    def controller_address(self) -> str:
        """The controller host's address: the management bridge's, in the root namespace."""
        return f"{self.subnet('mgmt')}.1"

    def namespace(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def bridge(self, net: str) -> str:
        return f"{self.prefix}-{net}"

    def veth(self, node: str, net: str) -> str:
        """The host side of the node's link to bridge `net` (inside, it is renamed to mgmt0 / fab0)."""
        return f"{self.prefix}-{node}-{net[0]}"

    def address(self, node: str, net: str = "mgmt") -> str:
        return f"{self.subnet(net)}.{10 + self.nodes.index(node) + 1}"

    def hosts_file(self, node: str) -> str:
        """/etc/hosts inside `node`: this machine's name is the node's own address, the nodes by name."""
        lines = ["127.0.0.1 localhost", f"{self.address(node)} {socket.gethostname()}"]
        lines += [f"{self.address(other)} {other}" for other in self.nodes if other != node]
        return "\n".join(lines) + "\n"

    def create_commands(self) -> list[list[str]]:
        cmds: list[list[str]] = []
        for net in _NETS:
            cmds += [
                ["ip", "link", "add", self.bridge(net), "type", "bridge"],
                ["ip", "link", "set", self.bridge(net), "up"],
            ]
        cmds.append(["ip", "addr", "add", f"{self.controller_address}/24", "dev", self.bridge("mgmt")])
        for node in self.nodes:
            ns = self.namespace(node)
            inside = ["ip", "-n", ns]
            cmds += [["ip", "netns", "add", ns], [*inside, "link", "set", "lo", "up"]]
            for net, name in _NETS.items():
                veth = self.veth(node, net)
                cmds += [
                    ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p", "netns", ns],
                    ["ip", "link", "set", veth, "master", self.bridge(net)],
                    ["ip", "link", "set", veth, "up"],
                    [*inside, "link", "set", f"{veth}p", "name", name],
                    [*inside, "addr", "add", f"{self.address(node, net)}/24", "dev", name],
                    [*inside, "link", "set", name, "up"],
                ]
        return cmds

    def exec_prefix(self, node: str) -> list[str]:
        """Prepend to a command line to run it on `node`: in its namespace, with its /etc/hosts.

        Not `ip netns exec`, which also mounts a fresh /sys and so hides the cgroup file system slurmd needs.
        """
        hosts = str(NETNS_ETC / self.namespace(node) / "hosts")
        bind_hosts = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return [
            *["nsenter", f"--net=/run/netns/{self.namespace(node)}", "--"],
            *["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind_hosts, hosts],
        ]

    def link_command(self, node: str, up: bool, net: str = "mgmt") -> list[str]:
        """Take `node`'s link to bridge `net` down or up, from the host side (the node sees its carrier go)."""
        return ["ip", "link", "set", self.veth(node, net), "up" if up else "down"]

    def route_command(self, node: str, peer: str, blocked: bool, net: str = "mgmt") -> list[str]:
        """Inside `node`, drop (or stop dropping) what it sends to `peer`'s address on `net`: a one-way cut
        (the peer's packets still arrive; `node`'s answers to them vanish)."""
        verb = "replace" if blocked else "del"
        return ["ip", "-n", self.namespace(node), "route", verb, "blackhole", f"{self.address(peer, net)}/32"]


def _ip(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = find_binary("ip")
    if binary is None:
        raise ClusterError("the `ip` command (iproute2) is missing: apt-get install iproute2")
    result = subprocess.run([binary, *argv[1:]], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.returncode}")
    return result


def _ours(names: list[str], prefix: str) -> list[str]:
    return [n for n in names if n.startswith(f"{prefix}-")]


def _namespaces() -> list[str]:
    return [
        line.split()[0] for line in _ip(["ip", "-o", "netns", "list"], check=False).stdout.splitlines() if line.strip()
    ]


def _links() -> list[str]:
    # `ip -o link` lines read "7: se-n1-m@if6: <BROADCAST,...": the name is the second field, before any '@'.
    lines = _ip(["ip", "-o", "link", "show"], check=False).stdout.splitlines()
    return [line.split(":")[1].strip().split("@")[0] for line in lines if line.count(":") >= 2]


def _drop_hosts(directory: Path) -> None:
    (directory / "hosts").unlink(missing_ok=True)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()


def remove(net: HostNetwork) -> None:
    """Remove every namespace, bridge, link and hosts file named with `net`'s prefix (those of a crashed run too)."""
    for ns in _ours(_namespaces(), net.prefix):
        _ip(["ip", "netns", "del", ns], check=False)  # the veths inside go with it, and their host ends
    for link in _ours(_links(), net.prefix):
        _ip(["ip", "link", "del", link], check=False)
    if NETNS_ETC.is_dir():
        for directory in NETNS_ETC.glob(f"{net.prefix}-*"):
            _drop_hosts(directory)
        if not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()
    left = _ours(_namespaces(), net.prefix) + _ours(_links(), net.prefix)
    if left:
        raise ClusterError(f"{', '.join(left)} survived removal; see `ip netns list` and `ip link`")


def create(net: HostNetwork) -> None:
    """Create `net` afresh (whatever an earlier run left is removed first)."""
    remove(net)
    try:
        for argv in net.create_commands():
            _ip(argv)
        for node in net.nodes:
            directory = NETNS_ETC / net.namespace(node)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(net.hosts_file(node))
    except BaseException:
        remove(net)
        raise


def set_link(net: HostNetwork, node: str, up: bool, which: str = "mgmt") -> None:
    """Take `node`'s link to bridge `which` down (a cable pulled: its packets vanish, no socket is closed)
    or bring it back."""
    _ip(net.link_command(node, up, which))


def set_route(net: HostNetwork, node: str, peer: str, blocked: bool, which: str = "mgmt") -> None:
    """Cut what `node` sends to `peer` on bridge `which`, or mend it (mending an intact route is no error)."""
    _ip(net.route_command(node, peer, blocked, which), check=blocked)
