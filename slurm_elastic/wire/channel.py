"""Framing and authentication of control connections.

A frame is a 4-byte big-endian length and one JSON message. Every connection starts with a
challenge-response: the server sends a random nonce, the client answers HMAC-SHA256(secret, nonce|role|job)
so the secret itself never crosses the wire; a wrong or missing proof closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
import socket
import struct
import threading

from pydantic import BaseModel, ValidationError

from slurm_elastic.errors import AuthError, InvalidMessage, ProtocolError
from slurm_elastic.wire.messages import Challenge, Hello, Message, Refused, Role, Welcome, parse_message

MAX_FRAME = 4 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 5.0
_HEADER = struct.Struct(">I")


def new_secret() -> str:
    return secrets.token_hex(32)


def proof(secret: str, nonce: str, role: str, job_id: str) -> str:
    return hmac.new(secret.encode(), f"{nonce}|{role}|{job_id}".encode(), hashlib.sha256).hexdigest()


def encode_frame(msg: BaseModel) -> bytes:
    body = msg.model_dump_json().encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message {type(msg).__name__} is {len(body)} bytes; the limit is {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Message:
    try:
        return parse_message(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidMessage(f"invalid control message: {first['msg']} at {first['loc']}") from None


def _check_length(length: int) -> int:
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {MAX_FRAME}")
    return length


# --- blocking side: workers, agents, command-line clients -------------------------------------------


class Channel:
    """A connected, authenticated control connection (blocking). Sends are serialised by a lock."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, msg: BaseModel) -> None:
        data = encode_frame(msg)
        with self._send_lock:
            self._sock.sendall(data)

    def recv(self, timeout: float | None = None) -> Message:
        self._sock.settimeout(timeout)
        (length,) = _HEADER.unpack(self._recv_exact(_HEADER.size))
        return decode_body(self._recv_exact(_check_length(length)))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("control connection closed by peer")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProtocolError(f"invalid coordinator address {address!r}: expected HOST:PORT")
    return host, int(port)


def connect(address: str, *, secret: str, job_id: str, role: Role, timeout: float = 10.0) -> Channel:
    """Connect to a coordinator and prove knowledge of the job's secret."""
    host, port = parse_address(address)
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    channel = Channel(sock)
    try:
        challenge = channel.recv(timeout=HANDSHAKE_TIMEOUT_S)
        if not isinstance(challenge, Challenge):
            raise ProtocolError(f"expected a challenge from {address}, got {challenge.type!r}")
        if challenge.job_id != job_id:
            raise AuthError(f"{address} serves job {challenge.job_id!r}, not {job_id!r}")
        channel.send(Hello(role=role, job_id=job_id, proof=proof(secret, challenge.nonce, role, job_id)))
        answer = channel.recv(timeout=HANDSHAKE_TIMEOUT_S)
        if isinstance(answer, Refused):
            raise AuthError(f"coordinator {address} refused the connection: {answer.reason}")
        if not isinstance(answer, Welcome):
            raise ProtocolError(f"expected welcome from {address}, got {answer.type!r}")
    except BaseException:
        channel.close()
        raise
    sock.settimeout(None)
    return channel


def request(address: str, msg: BaseModel, *, secret: str, job_id: str, timeout: float = 10.0) -> Message:
    """One request, one reply, as a `client` (status, drain...)."""
    channel = connect(address, secret=secret, job_id=job_id, role="client", timeout=timeout)
    try:
        channel.send(msg)
        return channel.recv(timeout=timeout)
    finally:
        channel.close()


# --- asyncio side: the coordinator ------------------------------------------------------------------


async def read_message(reader: asyncio.StreamReader) -> Message:
    header = await reader.readexactly(_HEADER.size)
    (length,) = _HEADER.unpack(header)
    return decode_body(await reader.readexactly(_check_length(length)))


def write_message(writer: asyncio.StreamWriter, msg: BaseModel) -> None:
    writer.write(encode_frame(msg))


async def accept_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, secret: str, job_id: str
) -> Role:
    """Run the server side of the handshake; returns the client's role or raises AuthError/ProtocolError."""
    nonce = secrets.token_hex(16)
    write_message(writer, Challenge(job_id=job_id, nonce=nonce))
    await writer.drain()
    try:
        hello = await asyncio.wait_for(read_message(reader), HANDSHAKE_TIMEOUT_S)
    except TimeoutError:
        raise AuthError("no hello within the handshake timeout") from None
    if not isinstance(hello, Hello):
        raise AuthError(f"expected hello, got {hello.type!r}")
    expected = proof(secret, nonce, hello.role, job_id)
    if hello.job_id != job_id or not hmac.compare_digest(expected, hello.proof):
        write_message(writer, Refused(reason="bad job secret"))
        await writer.drain()
        raise AuthError(f"bad proof from a {hello.role!r} client")
    write_message(writer, Welcome())
    await writer.drain()
    return hello.role
