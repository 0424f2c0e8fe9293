"""Can this node reach its peers over the training groups' network? (effects; decide.reachability decides)

Each agent listens on its node's group address (`ProbeListener`): a peer that completes a TCP handshake
with it has a working path both ways (its SYN arrived, the answer came back), which is what gloo's and
NCCL's connections need. The listener reads nothing and answers nothing: it accepts and closes, so what a
stranger sends it cannot matter. `unreachable` tries every target at once (non-blocking connects, a bounded
number in flight), as forming a gloo group connects to every peer anyway.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Mapping

from slurm_elastic.logs import get_logger

__all__ = ["IN_FLIGHT", "ProbeListener", "parse_address", "unreachable"]

IN_FLIGHT = 512  # connects at once: far below a process's open-file limit, and a whole rack per batch
log = get_logger("slurm_elastic.probe")


def parse_address(text: str) -> tuple[str, int] | None:
    """ "ip:port" as a socket address, or None for anything else."""
    host, _, port = text.rpartition(":")
    try:
        socket.inet_aton(host)
        number = int(port)
    except (OSError, ValueError):
        return None
    return (host, number) if 0 < number < 65536 else None


class ProbeListener:
    """Accepts and closes connections on `address`, port chosen by the system, until stopped."""

    def __init__(self, address: str) -> None:
        self._socket = socket.create_server((address, 0), backlog=1024)
        self.address = "{}:{}".format(*self._socket.getsockname()[:2])
        self._thread = threading.Thread(target=self._serve, name="se-probe-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                peer, _ = self._socket.accept()
            except OSError:  # closed by stop()
                return
            peer.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()


def unreachable(targets: Mapping[str, str], timeout_s: float, source: str | None = None) -> list[str]:
    """The names in `targets` (name -> "ip:port") that no connection from `source` (an address of this
    node; None: the system's choice) reached within `timeout_s`."""
    names = list(targets)
    failed: list[str] = []
    for start in range(0, len(names), IN_FLIGHT):
        batch = {name: targets[name] for name in names[start : start + IN_FLIGHT]}
        failed += _try_batch(batch, timeout_s, source)
    return sorted(failed)


def _try_batch(targets: Mapping[str, str], timeout_s: float, source: str | None) -> list[str]:
    failed: list[str] = []
    pending: dict[socket.socket, str] = {}
    with selectors.DefaultSelector() as selector:
        try:
            for name, text in targets.items():
                address = parse_address(text)
                if address is None:
                    failed.append(name)
                    continue
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                try:
                    if source is not None:
                        sock.bind((source, 0))
                    code = sock.connect_ex(address)
                except OSError:
                    code = errno.EADDRNOTAVAIL
                if code not in (0, errno.EINPROGRESS):
                    failed.append(name)
                    sock.close()
                    continue
                pending[sock] = name
                selector.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + timeout_s
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    sock = key.fileobj  # type: ignore[assignment]
                    assert isinstance(sock, socket.socket)
                    name = pending.pop(sock)
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                        failed.append(name)
                    selector.unregister(sock)
                    sock.close()
            failed += pending.values()  # no answer in time: a dropped SYN, or a dropped answer
        finally:
            for sock in pending:
                sock.close()
    return failed
