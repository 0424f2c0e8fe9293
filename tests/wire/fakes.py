"""A fake server for the client's side of the handshake: a thread on 127.0.0.1 that runs a script on its
one connection, and frames written by hand (as any program could)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

Script = Callable[[socket.socket, threading.Event], None]


@contextlib.contextmanager
def fake_server(script: Script) -> Iterator[str]:
    """A server on 127.0.0.1 that runs `script` on its one connection, in a thread; stopped on exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            conns.append(conn)
            with contextlib.suppress(OSError):
                script(conn, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        listener.close()
        thread.join(10)


def frame(body: Any) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


def read_frame(conn: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack(">I", conn.recv(4, socket.MSG_WAITALL))
    return json.loads(conn.recv(length, socket.MSG_WAITALL))
