"""A node's probe of its peers, over real sockets on loopback: a listener is reached; a closed port, an
address nobody answers from and a malformed one are not; the listener stops."""

from __future__ import annotations

import socket

from slurm_elastic.probe import ProbeListener, parse_address, unreachable


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nobody listens once it is closed


def test_a_listener_is_reached_and_a_closed_port_is_not() -> None:
    listener = ProbeListener("127.0.0.1")
    try:
        targets = {"up": listener.address, "down": closed_port(), "bad": "not-an-address", "port": "127.0.0.1:0"}
        assert unreachable(targets, timeout_s=5.0, source="127.0.0.1") == ["bad", "down", "port"]
        assert unreachable({"up": listener.address}, timeout_s=5.0) == []
    finally:
        listener.stop()
    assert unreachable({"stopped": listener.address}, timeout_s=5.0) == ["stopped"]


def test_many_targets_are_tried_in_batches() -> None:
    listener = ProbeListener("127.0.0.1")
    try:
        targets = {f"n{i}": listener.address for i in range(1200)}  # more than one batch in flight
        targets["gone"] = closed_port()
        assert unreachable(targets, timeout_s=20.0) == ["gone"]
    finally:
        listener.stop()


def test_a_listener_answers_nothing() -> None:
    listener = ProbeListener("127.0.0.1")
    try:
        host, port = parse_address(listener.address) or ("", 0)
        with socket.create_connection((host, port), timeout=5) as peer:
            peer.sendall(b"anything")
            peer.settimeout(5)
            try:
                answer = peer.recv(100)
            except ConnectionResetError:  # closed with our bytes unread
                answer = b""
            assert answer == b""
    finally:
        listener.stop()


def test_parse_address() -> None:
    assert parse_address("10.0.0.5:4000") == ("10.0.0.5", 4000)
    assert parse_address("host:4000") is None
    assert parse_address("10.0.0.5:70000") is None
    assert parse_address("10.0.0.5") is None
