"""The TCP sockets a process holds, from /proc: to check that a job step talks over its node's addresses.

`parse_tcp_table` is pure (one /proc/<pid>/net/tcp or tcp6 text); `tcp_sockets` joins that table of the
process's network namespace with the socket inodes among its open files.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

__all__ = ["TcpSocket", "parse_tcp_table", "tcp_sockets"]

_LISTEN = "0A"


@dataclass(frozen=True)
class TcpSocket:
    local: str  # "10.77.0.11:45123"
    remote: str  # "0.0.0.0:0" for a listening socket
    listening: bool

    @property
    def on_loopback(self) -> bool:
        """Bound to or connected through a loopback address."""
        return any(
            ipaddress.ip_address(end.rsplit(":", 1)[0].strip("[]")).is_loopback for end in (self.local, self.remote)
        )


def _endpoint(raw: str) -> str:
    host, port = raw.split(":")
    packed = bytes.fromhex(host)
    # The kernel prints each 32-bit word of the address in host (little-endian) byte order.
    words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    text = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    return f"{text}:{int(port, 16)}"


def parse_tcp_table(text: str) -> dict[int, TcpSocket]:
    """/proc/<pid>/net/tcp (or tcp6) -> socket inode -> socket; entries without an inode (TIME_WAIT) are left out."""
    found = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or not fields[9].isdigit() or fields[9] == "0":
            continue
        found[int(fields[9])] = TcpSocket(_endpoint(fields[1]), _endpoint(fields[2]), fields[3] == _LISTEN)
    return found


def tcp_sockets(pid: int) -> list[TcpSocket]:
    """The TCP sockets process `pid` holds open now (empty if it is gone)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
        table: dict[int, TcpSocket] = {}
        for name in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{name}") as f:
                    table.update(parse_tcp_table(f.read()))
            except FileNotFoundError:
                continue
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [table[i] for i in sorted(inodes) if i in table]
