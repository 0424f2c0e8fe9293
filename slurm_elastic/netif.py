"""Which network interface a node's training groups use.

A node of a real cluster has several interfaces (management Ethernet, a fast fabric). Left alone, gloo and
NCCL take the address the host name resolves to, which may be loopback or the slow network. The agent
decides for its node instead, and hands the choice to its workers as torch's own variables:

1. `SLURM_ELASTIC_IFNAME`, when set (it must name an interface of the node that has an IPv4 address);
2. else torch's own variables (`GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME`), when the user set one: then
   the job leaves both as they are;
3. else the interface on the node's route to the coordinator: every node reaches the coordinator, so
   that is a network the nodes share.

`choose` is pure; `interfaces` and `route_address` ask the machine.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastic.errors import ConfigError

__all__ = ["ENV_IFNAME", "GroupInterface", "choose", "for_node", "interfaces", "route_address"]

ENV_IFNAME = "SLURM_ELASTIC_IFNAME"
TORCH_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
ROUTE = "route to the coordinator"
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class GroupInterface:
    name: str
    address: str | None  # its IPv4 address; None where torch's variable names what this node lacks
    source: str  # what chose it: ENV_IFNAME, a torch variable, or ROUTE

    def describe(self) -> str:
        return f"{self.name} {self.address or '?'} ({self.source})"

    def worker_env(self) -> dict[str, str]:
        """The variables that make gloo and NCCL use this interface (none where the user's own decide)."""
        if self.source in TORCH_VARIABLES:
            return {}
        return {variable: self.name for variable in TORCH_VARIABLES}


def choose(env: Mapping[str, str], addresses: Mapping[str, str], route: str | None) -> GroupInterface | None:
    """The interface of the groups on a node whose interfaces have `addresses` (name -> IPv4) and whose
    route to the coordinator leaves from address `route`; None: torch's own default."""
    named = env.get(ENV_IFNAME, "").strip()
    if named:
        if named not in addresses:
            have = ", ".join(sorted(addresses)) or "none"
            raise ConfigError(
                f"{ENV_IFNAME}={named!r}: this node has no such interface with an IPv4 address (it has: {have})"
            )
        return GroupInterface(named, addresses[named], ENV_IFNAME)
    for variable in TORCH_VARIABLES:
        value = env.get(variable, "").strip()
        if value:
            return GroupInterface(value, addresses.get(value.split(",")[0]), variable)
    by_address = {address: name for name, address in addresses.items()}
    if route is not None and route in by_address:
        return GroupInterface(by_address[route], route, ROUTE)
    return None


def interfaces() -> dict[str, str]:
    """This node's interfaces that have an IPv4 address: name -> address."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address (or the interface went away meanwhile)
                continue
            found[name] = socket.inet_ntoa(raw[20:24])
    return found


def route_address(host: str) -> str | None:
    """The local address this node's traffic to `host` leaves from (a UDP connect sends nothing)."""
    try:
        target = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def for_node(coordinator: str, env: Mapping[str, str]) -> GroupInterface | None:
    """`choose` for this node, whose coordinator is at `coordinator` ("host:port")."""
    host = coordinator.rsplit(":", 1)[0].strip("[]")
    return choose(env, interfaces(), route_address(host))
