"""The client's side of the handshake against a server that does not hold the secret yet puts terminal
escapes and its own words in every field, on 127.0.0.1: none of them may reach the client's error, which
still names the address. Every server thread and socket is closed by its test."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from slurm_elastic.errors import ProtocolError
from slurm_elastic.wire import channel as ch

from .fakes import Script, fake_server, frame, read_frame

pytestmark = pytest.mark.timeout(60)
SECRET = ch.new_secret()
JOB = "job-7"
MARK = "PWNED"
HOSTILE = f"{MARK}\n\x1b[2J\x1b]0;{MARK}\x07\u009b31m\r"


def challenge() -> dict[str, Any]:
    return {"type": "challenge", "job_id": JOB, "nonce": "ab" * 16}


def answers(first: Any, second: Any | None = None) -> Script:
    def script(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(frame(first))
        if second is not None:
            read_frame(conn)
            conn.sendall(frame(second))
        stop.wait(30)

    return script


HOSTILE_SERVERS: dict[str, Script] = {
    "a refusal's reason": answers(challenge(), {"type": "refused", "reason": HOSTILE}),
    "the challenge's job id": answers({"type": "challenge", "job_id": HOSTILE, "nonce": "ab" * 16}),
    "an extra key in the challenge": answers({**challenge(), HOSTILE: HOSTILE}),
    "the challenge's type": answers({"type": HOSTILE}),
    "a malformed nonce": answers({**challenge(), "nonce": HOSTILE}),
    "an extra key in the welcome": answers(challenge(), {"type": "welcome", "proof": "0" * 64, HOSTILE: 1}),
    "another message for a welcome": answers(challenge(), {"type": "stop", "reason": HOSTILE}),
    "invalid json": answers(challenge(), (b'{"type": "welcome", "' + HOSTILE.encode() + b"\xff")),
}


@pytest.mark.parametrize("server", HOSTILE_SERVERS.values(), ids=HOSTILE_SERVERS.keys())
def test_an_unauthenticated_servers_words_never_reach_the_clients_error(server: Script) -> None:
    with fake_server(server) as address, pytest.raises(ProtocolError) as raised:
        ch.connect(address, secret=SECRET, job_id=JOB, role="agent", timeout=5)
    text = str(raised.value)
    assert MARK not in text and "\x1b" not in text and "\\x1b" not in text, text
    assert address in text  # it still says who failed
