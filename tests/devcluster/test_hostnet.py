"""The host network of the local cluster: its plan (names, addresses, hosts files, `ip` commands) is pure;
made for real (as root), its nodes reach each other, a cut link stops them, and removal leaves nothing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.testing.devcluster import hostnet
from slurm_elastic.testing.devcluster.hostnet import FABRIC_IF, MGMT_IF, HostNetwork
from slurm_elastic.testing.devcluster.sockets import TcpSocket, parse_tcp_table

pytestmark = pytest.mark.timeout(30)
NODES = ("n1", "n2", "n3")


def test_each_node_has_one_address_per_network_and_the_controller_its_own() -> None:
    net = HostNetwork(NODES)
    mgmt = [net.address(n) for n in NODES]
    fab = [net.address(n, "fab") for n in NODES]
    assert mgmt == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
    assert fab == ["10.78.0.11", "10.78.0.12", "10.78.0.13"]
    assert net.controller_address == "10.77.0.1"
    assert net.controller_address not in mgmt + fab


def test_a_second_cluster_gets_other_names_and_subnets() -> None:
    one, two = HostNetwork(NODES), HostNetwork(NODES, index=7)
    assert two.address("n1") == "10.77.7.11" and two.controller_address == "10.77.7.1"
    names = lambda net: {net.namespace(n) for n in NODES} | {net.bridge("mgmt"), net.bridge("fab")}  # noqa: E731
    assert not names(one) & names(two)
    # Removal goes by prefix: neither cluster's prefix is a prefix of the other's names.
    assert not any(name.startswith(f"{one.prefix}-") for name in names(two))


def test_link_names_fit_the_kernel_limit() -> None:
    net = HostNetwork(tuple(f"n{i}" for i in range(1, 100)), index=249)
    for node in net.nodes:
        for kind in ("mgmt", "fab"):
            assert len(net.veth(node, kind) + "p") <= 15  # IFNAMSIZ - 1, the peer's temporary name too


def test_hosts_file_maps_this_machine_to_the_node_and_names_the_others() -> None:
    text = HostNetwork(NODES).hosts_file("n2")
    entries = [line.split() for line in text.splitlines()]
    assert ["127.0.0.1", "localhost"] in entries
    assert ["10.77.0.12", socket.gethostname()] in entries
    assert ["10.77.0.11", "n1"] in entries and ["10.77.0.13", "n3"] in entries
    assert not any(e[1] == "n2" for e in entries)


def test_create_commands_give_each_namespace_both_interfaces_and_no_default_route() -> None:
    net = HostNetwork(("n1",))
    cmds = [" ".join(c) for c in net.create_commands()]
    assert "ip netns add se-n1" in cmds
    assert f"ip -n se-n1 addr add 10.77.0.11/24 dev {MGMT_IF}" in cmds
    assert f"ip -n se-n1 addr add 10.78.0.11/24 dev {FABRIC_IF}" in cmds
    assert "ip addr add 10.77.0.1/24 dev se-mgmt" in cmds
    assert not [c for c in cmds if "route" in c]  # only the /24s: nothing outside the cluster is reachable
    # Bridges exist before a veth is attached to them.
    assert cmds.index("ip link add se-mgmt type bridge") < cmds.index("ip link set se-n1-m master se-mgmt")


def test_link_command_acts_on_the_host_side() -> None:
    net = HostNetwork(NODES)
    assert net.link_command("n2", up=False) == ["ip", "link", "set", "se-n2-m", "down"]
    assert net.link_command("n2", up=True, net="fab") == ["ip", "link", "set", "se-n2-f", "up"]
    cut = ["ip", "-n", "se-n2", "route", "replace", "blackhole", "10.77.0.13/32"]
    assert net.route_command("n2", "n3", blocked=True) == cut
    assert net.route_command("n2", "n3", blocked=False, net="fab")[-3:] == ["del", "blackhole", "10.78.0.13/32"]


def test_proc_tcp_tables_parse_to_addresses_and_ports() -> None:
    tcp = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:AF2D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2639660 1 0 100\n"
        "   1: 0B004D0A:9C40 0C004D0A:4269 01 00000000:00000000 00:00000000 00000000     0        0 77 1 0 20\n"
        "   2: 0100007F:8DF8 0100007F:8269 06 00000000:00000000 03:00001564 00000000     0        0 0 3 0\n"
    )
    table = parse_tcp_table(tcp)
    assert set(table) == {2639660, 77}  # TIME_WAIT (inode 0) belongs to no process
    assert table[2639660] == TcpSocket("127.0.0.1:44845", "0.0.0.0:0", listening=True)
    assert table[77] == TcpSocket("10.77.0.11:40000", "10.77.0.12:17001", listening=False)
    assert table[2639660].on_loopback and not table[77].on_loopback
    tcp6 = (
        "  sl  local_address                         remote_address                        st tx_queue rx_queue\n"
        "   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000B004D0A:A000 01 0:0 0:0 0 0 0 9 1\n"
        "   1: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 10 1\n"
    )
    six = parse_tcp_table(tcp6)
    assert six[9] == TcpSocket("127.0.0.1:8080", "10.77.0.11:40960", listening=False) and six[9].on_loopback
    assert six[10].local == "[::1]:8081" and six[10].on_loopback


def _on(net: HostNetwork, node: str, code: str, *, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    argv = [*net.exec_prefix(node), sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(120)
def test_a_network_is_made_reached_cut_and_removed_leaving_nothing() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI runs as root with iproute2: network namespaces must be tested there")
        pytest.skip("making network namespaces needs root and iproute2")
    net = HostNetwork(("n1", "n2"), index=213)  # names and subnets of its own, beside a running cluster
    hostnet.create(net)
    hostnet.create(net)  # again, as after a crashed run: whatever was there is replaced
    try:
        listener = subprocess.Popen(
            [*net.exec_prefix("n1"), sys.executable, "-c",
             "import socket; s = socket.create_server(('0.0.0.0', 47213)); print('up', flush=True)\n"
             "while True: s.accept()[0].close()"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert listener.stdout is not None and listener.stdout.readline().strip() == "up"
            connect = "import socket; socket.create_connection(('{}', 47213), timeout=2).close()"
            n1 = net.address("n1")
            assert _on(net, "n2", connect.format(n1)).returncode == 0
            here = _on(net, "n2", "import socket; print(socket.gethostbyname(socket.gethostname()))")
            assert here.stdout.strip() == net.address("n2")  # a node's own name is its own address
            assert _on(net, "n2", connect.format("127.0.0.1")).returncode != 0  # n1's loopback is not n2's
            hostnet.set_link(net, "n1", up=False)
            assert _on(net, "n2", connect.format(n1)).returncode != 0  # cut: nothing gets through
            hostnet.set_link(net, "n1", up=True)
            assert _on(net, "n2", connect.format(n1)).returncode == 0
            hostnet.set_route(net, "n1", "n2", blocked=True)  # one way: n1's answers to n2 vanish
            hostnet.set_route(net, "n1", "n2", blocked=True)  # (again: no error)
            assert _on(net, "n2", connect.format(n1)).returncode != 0
            hostnet.set_route(net, "n1", "n2", blocked=False)
            hostnet.set_route(net, "n1", "n2", blocked=False)
            assert _on(net, "n2", connect.format(n1)).returncode == 0
        finally:
            listener.kill()
            listener.wait()
    finally:
        hostnet.remove(net)
    netns = subprocess.run(["ip", "-o", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    assert "se213-" not in netns and "se213-" not in links
    assert not list(Path("/etc/netns").glob("se213-*"))
    hostnet.remove(net)  # and removing nothing is fine
