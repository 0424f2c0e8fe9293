"""The challenge-response handshake against a real asyncio server on 127.0.0.1.

The server side is `accept_handshake` as the coordinator runs it; the client side is the blocking
`connect`/`request`, run in a thread. Every server, writer and socket is closed by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from slurm_elastic.errors import AuthError, HandshakeRefused, ProtocolError
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
                ch.write_message(writer, msg.Welcome(proof="0" * 64))  # not a coordinator: no challenge
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
    assert isinstance(server_result, HandshakeRefused) and server_result.category == "bad proof"


def test_client_refuses_a_server_of_another_job() -> None:
    client_result, server_result = serve(lambda a: ch.connect(a, secret=SECRET, job_id="job-8", role="worker"))
    assert isinstance(client_result, AuthError)
    assert "serves another job, not 'job-8'" in str(client_result)
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
    assert isinstance(server_result, HandshakeRefused) and server_result.category == "timeout"
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
            channel.send(msg.Hello(role="worker", job_id=JOB, nonce="0" * 32, proof=stolen["proof"]))
            assert isinstance(channel.recv(timeout=5), msg.Welcome)

    def replay(address: str) -> msg.Message:
        with socket.create_connection(ch.parse_address(address), timeout=5) as sock:
            channel = ch.Channel(sock)
            channel.recv(timeout=5)
            channel.send(msg.Hello(role="worker", job_id=JOB, nonce="0" * 32, proof=stolen["proof"]))
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


# --- the server proves the secret too: an impostor on a reused address is refused --------------------------


def _raw_frame(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


async def _impostor(client: Client, welcome: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[Any, list[bytes]]:
    """A process that took over the coordinator's address: it speaks the protocol (raw JSON frames, as
    any program could), but does not hold the secret. Returns the client's outcome and every frame the
    client sent after the handshake (none may leak)."""
    after: list[bytes] = []
    finished = asyncio.Event()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(_raw_frame({"type": "challenge", "job_id": JOB, "nonce": "ab" * 16}))
            await writer.drain()
            (length,) = struct.unpack(">I", await reader.readexactly(4))
            hello = json.loads(await reader.readexactly(length))
            writer.write(_raw_frame(welcome(hello)))
            await writer.drain()
            while True:
                (length,) = struct.unpack(">I", await reader.readexactly(4))
                after.append(await reader.readexactly(length))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            finished.set()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        try:
            result: Any = await asyncio.to_thread(client, f"127.0.0.1:{port}")
        except Exception as exc:
            result = exc
        await asyncio.wait_for(finished.wait(), 10)
    finally:
        server.close()
        await server.wait_closed()
    return result, after


WELCOMES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    # what the coordinator sent before the server proved anything: any process can send it
    "no proof": lambda hello: {"type": "welcome"},
    "a made-up proof": lambda hello: {"type": "welcome", "proof": "0" * 64},
    "the client's own proof reflected": lambda hello: {"type": "welcome", "proof": hello["proof"]},
    "a proof with another secret": lambda hello: {
        "type": "welcome",
        "proof": ch.server_proof(ch.new_secret(), hello.get("nonce", ""), "ab" * 16, hello["role"], JOB),
    },
}


@pytest.mark.parametrize("welcome", WELCOMES.values(), ids=WELCOMES.keys())
def test_a_request_never_reaches_an_impostor(welcome: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    def ask(address: str) -> msg.Message:
        drain = msg.DrainRequest(nodes=["n1"], mode="now")
        return ch.request(address, drain, secret=SECRET, job_id=JOB, timeout=5)

    result, after = asyncio.run(_impostor(ask, welcome))
    assert isinstance(result, ProtocolError), result
    assert after == []  # the drain request was never sent


@pytest.mark.parametrize("welcome", WELCOMES.values(), ids=WELCOMES.keys())
def test_a_worker_never_registers_with_an_impostor(welcome: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    from slurm_elastic.worker.membership.comm import Interrupt
    from slurm_elastic.worker.membership.control import ControlClient, Identity

    def register(address: str) -> Any:
        control = ControlClient(address, SECRET, Identity(JOB, "n1:0:0", "n1", 0), Interrupt())
        try:
            return control.register(committed_step=-1, pid=1)
        finally:
            control.close()

    result, after = asyncio.run(_impostor(register, welcome))
    assert isinstance(result, ProtocolError), result
    assert after == []


def test_the_impostors_failure_names_the_reason() -> None:
    result, _ = asyncio.run(
        _impostor(lambda a: ch.connect(a, secret=SECRET, job_id=JOB, role="agent"), WELCOMES["a made-up proof"])
    )
    assert isinstance(result, AuthError)
    assert "could not prove that it holds job 'job-7''s secret: not its coordinator" in str(result)


def test_the_server_proof_binds_the_clients_nonce() -> None:
    base = ch.server_proof("s", "c", "n", "worker", "j")
    assert base != ch.server_proof("s", "d", "n", "worker", "j") != ch.server_proof("s", "c", "m", "worker", "j")
    assert base != ch.server_proof("s", "c", "n", "agent", "j") != ch.server_proof("t", "c", "n", "worker", "j")
    assert base != ch.proof("s", "c", "worker", "j")  # never the client's proof for the same values


def test_an_oversized_challenge_is_not_read() -> None:
    """A client reads at most PREAUTH_MAX_FRAME bytes from a server it has not authenticated."""

    def oversized(address: str) -> Any:
        return ch.connect(address, secret=SECRET, job_id=JOB, role="worker", timeout=5)

    async def main() -> Any:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(struct.pack(">I", 10 * 1024 * 1024))
            await writer.drain()
            await reader.read()
            writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            try:
                return await asyncio.to_thread(oversized, f"127.0.0.1:{port}")
            except Exception as exc:
                return exc
        finally:
            server.close()
            await server.wait_closed()

    result = asyncio.run(main())
    assert isinstance(result, ProtocolError) and "exceeds the limit of 1024" in str(result)


def test_a_handshake_cut_short_is_retried_when_asked() -> None:
    """A coordinator under a flood evicts the oldest handshakes: an honest client tries again."""

    async def main(retry_s: float) -> Any:
        seen = 0

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal seen
            seen += 1
            try:
                if seen == 1:
                    writer.transport.abort()  # evicted
                    return
                await ch.accept_handshake(reader, writer, secret=SECRET, job_id=JOB)
                await reader.read()
            except Exception:
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        try:
            address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

            def client() -> str:
                channel = ch.connect(address, secret=SECRET, job_id=JOB, role="worker", timeout=5, retry_s=retry_s)
                channel.close()
                return "connected"

            try:
                return await asyncio.to_thread(client)
            except Exception as exc:
                return exc
        finally:
            server.close()
            await server.wait_closed()

    assert isinstance(asyncio.run(main(0.0)), ConnectionError)
    assert asyncio.run(main(5.0)) == "connected"
