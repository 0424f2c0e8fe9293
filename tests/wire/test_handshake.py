"""The challenge-response handshake against a real asyncio server on 127.0.0.1.

The server side is `accept_handshake` as the coordinator runs it; the client side is the blocking
`connect`/`request`, run in a thread. Every server, writer and socket is closed by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from slurm_elastic.errors import AuthError, ProtocolError
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

# A socket or transport left open fails the test instead of warning.
pytestmark = [
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]

SECRET = ch.new_secret()
JOB = "job-7"

Client = Callable[[str], Any]


async def _serve(client: Client, *, greet: bool = True) -> tuple[Any, Any]:
    """Serve one connection with `accept_handshake`; returns (what the client returned or raised,
    the server's role or exception). After the handshake the server answers one request with an Ack."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        result: Any
        try:
            if not greet:
                ch.write_message(writer, msg.Welcome())  # not a coordinator: no challenge
                await writer.drain()
                await reader.read()
                result = None
            else:
                result = await ch.accept_handshake(reader, writer, secret=SECRET, job_id=JOB)
                with contextlib.suppress(asyncio.IncompleteReadError):
                    request = await ch.read_message(reader)
                    ch.write_message(writer, msg.Ack(ok=True, detail=request.type))
                    await writer.drain()
        except Exception as exc:
            result = exc
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        done.set_result(result)

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        try:
            client_result = await asyncio.to_thread(client, f"127.0.0.1:{port}")
        except Exception as exc:
            client_result = exc
        server_result = await asyncio.wait_for(done, 10)
    finally:
        server.close()
        await server.wait_closed()
    return client_result, server_result


def serve(client: Client, *, greet: bool = True) -> tuple[Any, Any]:
    return asyncio.run(_serve(client, greet=greet))


def test_right_secret_gets_in() -> None:
    def client(address: str) -> msg.Message:
        channel = ch.connect(address, secret=SECRET, job_id=JOB, role="worker", timeout=5)
        try:
            channel.send(msg.StatusRequest())
            return channel.recv(timeout=5)
        finally:
            channel.close()

    client_result, role = serve(client)
    assert role == "worker"
    assert client_result == msg.Ack(ok=True, detail="status")


def test_request_is_one_round_trip_as_a_client() -> None:
    client_result, role = serve(lambda a: ch.request(a, msg.StatusRequest(), secret=SECRET, job_id=JOB, timeout=5))
    assert role == "client" and client_result == msg.Ack(ok=True, detail="status")


def test_wrong_secret_is_refused_on_both_sides() -> None:
    wrong = ch.new_secret()
    client_result, server_result = serve(lambda a: ch.connect(a, secret=wrong, job_id=JOB, role="agent", timeout=5))
    assert isinstance(client_result, AuthError) and "refused the connection: bad job secret" in str(client_result)
    assert isinstance(server_result, AuthError) and "bad proof from a 'agent' client" in str(server_result)


def test_client_refuses_a_server_of_another_job() -> None:
    client_result, server_result = serve(lambda a: ch.connect(a, secret=SECRET, job_id="job-8", role="worker"))
    assert isinstance(client_result, AuthError)
    assert "serves job 'job-7', not 'job-8'" in str(client_result)
    assert isinstance(server_result, Exception)  # the server never admits it


def test_client_refuses_a_server_that_sends_no_challenge() -> None:
    client_result, _ = serve(lambda a: ch.connect(a, secret=SECRET, job_id=JOB, role="worker"), greet=False)
    assert isinstance(client_result, ProtocolError) and not isinstance(client_result, AuthError)
    assert "expected a challenge" in str(client_result)


def test_silent_client_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "HANDSHAKE_TIMEOUT_S", 0.05)

    def silent(address: str) -> bytes:
        host, port = ch.parse_address(address)
        with socket.create_connection((host, port), timeout=5) as sock:
            received = b""
            while chunk := sock.recv(4096):  # the challenge, then EOF when the server gives up
                received += chunk
            return received

    client_result, server_result = serve(silent)
    assert isinstance(server_result, AuthError) and "no hello" in str(server_result)
    (length,) = struct.unpack(">I", client_result[:4])
    challenge = ch.decode_body(client_result[4 : 4 + length])
    assert isinstance(challenge, msg.Challenge) and challenge.job_id == JOB and len(challenge.nonce) == 32


def test_a_replayed_proof_does_not_open_a_second_connection() -> None:
    """The proof binds the server's fresh nonce, so one seen on the wire is useless later."""
    stolen: dict[str, str] = {}

    def honest(address: str) -> None:
        with socket.create_connection(ch.parse_address(address), timeout=5) as sock:
            channel = ch.Channel(sock)
            challenge = channel.recv(timeout=5)
            assert isinstance(challenge, msg.Challenge)
            stolen["proof"] = ch.proof(SECRET, challenge.nonce, "worker", JOB)
            channel.send(msg.Hello(role="worker", job_id=JOB, proof=stolen["proof"]))
            assert isinstance(channel.recv(timeout=5), msg.Welcome)

    def replay(address: str) -> msg.Message:
        with socket.create_connection(ch.parse_address(address), timeout=5) as sock:
            channel = ch.Channel(sock)
            channel.recv(timeout=5)
            channel.send(msg.Hello(role="worker", job_id=JOB, proof=stolen["proof"]))
            return channel.recv(timeout=5)

    _, first = serve(honest)
    assert first == "worker"
    answer, second = serve(replay)
    assert isinstance(answer, msg.Refused) and isinstance(second, AuthError)


def test_proof_binds_nonce_role_and_job() -> None:
    base = ch.proof("s", "n", "worker", "j")
    assert base == ch.proof("s", "n", "worker", "j") and len(base) == 64
    assert len({base, ch.proof("t", "n", "worker", "j"), ch.proof("s", "m", "worker", "j")}) == 3
    assert len({base, ch.proof("s", "n", "agent", "j"), ch.proof("s", "n", "worker", "k")}) == 3


def test_new_secret_is_random_hex() -> None:
    a, b = ch.new_secret(), ch.new_secret()
    assert a != b and len(a) == 64 and int(a, 16) >= 0


@pytest.mark.parametrize(
    ("address", "parsed"), [("127.0.0.1:80", ("127.0.0.1", 80)), ("::1:65535", ("::1", 65535)), ("h:1", ("h", 1))]
)
def test_parse_address(address: str, parsed: tuple[str, int]) -> None:
    assert ch.parse_address(address) == parsed


@pytest.mark.parametrize("address", ["host", ":80", "host:", "host:0", "host:65536", "host:http", "host:-1"])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ProtocolError, match=rf"invalid coordinator address '{address}': expected HOST:PORT"):
        ch.parse_address(address)
