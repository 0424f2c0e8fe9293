"""Framing and mutual authentication of control connections.

A frame is a 4-byte big-endian length and one JSON message. Every connection starts with a mutual
challenge-response, so the secret itself never crosses the wire:

    server -> Challenge(job, server nonce)
    client -> Hello(role, job, client nonce, HMAC-SHA256(secret, server nonce|role|job))
    server -> Welcome(HMAC-SHA256(secret, "server"|client nonce|server nonce|role|job))  or Refused

The server checks the client's proof before it says anything else, and the client checks the server's
before it trusts anything the server says: a process that took over a stale coordinator address cannot
pass. Before a peer is authenticated only frames of at most PREAUTH_MAX_FRAME bytes are read, the whole
exchange must end within HANDSHAKE_TIMEOUT_S on each side (one deadline, not one per read: a peer that
dribbles a byte at a time gains nothing), the coordinator keeps at most a fixed number of connections in
their handshake (`HandshakeGate`), and nothing the peer sent is quoted in an error: a failure names one of
REFUSAL_CATEGORIES.
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
import time
from collections import OrderedDict
from typing import Protocol

from pydantic import BaseModel, ValidationError

from slurm_elastic.errors import AuthError, HandshakeRefused, InvalidMessage, ProtocolError
from slurm_elastic.jobsecret import Secret
from slurm_elastic.wire.messages import Challenge, Hello, Message, Refused, Role, Welcome, parse_message

MAX_FRAME = 16 * 1024 * 1024  # read only from authenticated peers: a store value (8 MiB) in base64 fits
PREAUTH_MAX_FRAME = 1024  # a Challenge, Hello, Welcome or Refused is a few hundred bytes
HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING_HANDSHAKES = 64
# Why the coordinator refused a handshake: what its events say, instead of anything the peer sent.
REFUSAL_CATEGORIES = ("timeout", "oversized frame", "malformed hello", "not a hello", "wrong job", "bad proof")
_HEADER = struct.Struct(">I")
UNIX_PREFIX = "unix:"  # an address of a Unix socket (a node's store relay); unix:@NAME is an abstract one


def new_secret() -> Secret:
    return Secret(secrets.token_hex(32))


def proof(secret: str, nonce: str, role: str, job_id: str) -> str:
    """The client's proof: binds the server's fresh nonce, the role it asks for and the job."""
    return hmac.new(secret.encode(), f"{nonce}|{role}|{job_id}".encode(), hashlib.sha256).hexdigest()


def server_proof(secret: str, client_nonce: str, server_nonce: str, role: str, job_id: str) -> str:
    """The server's proof: binds the client's fresh nonce. Its message starts with `server|`, which a
    client's (a hex nonce first) never does, so one side's proof can never be replayed as the other's."""
    message = f"server|{client_nonce}|{server_nonce}|{role}|{job_id}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def encode_frame(msg: BaseModel) -> bytes:
    body = msg.model_dump_json().encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message {type(msg).__name__} is {len(body)} bytes; the limit is {MAX_FRAME}")
    return frame_of(body)


def frame_of(body: bytes) -> bytes:
    """A frame of one message's JSON `body` (a relay hands on a message it carries without re-encoding it)."""
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> Message:
    """One validated message. The error of an invalid one is bounded: pydantic's message and location quote
    the sender's own keys and values (callers read only authenticated peers' frames with it)."""
    try:
        return parse_message(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = repr(first["loc"])
        raise InvalidMessage(f"invalid control message: {first['msg'][:200]} at {where[:200]}") from None


def _check_length(length: int, limit: int | None = None) -> int:
    limit = MAX_FRAME if limit is None else limit
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {limit}")
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

    def recv(
        self, timeout: float | None = None, max_frame: int | None = None, *, deadline: float | None = None
    ) -> Message:
        """The next message. `timeout` bounds the whole frame, not each read of it, and so does `deadline`
        (a `time.monotonic()`, for several frames in one bound): a peer that sends a byte at a time holds
        the caller no longer. Past it, TimeoutError."""
        if timeout is not None:
            ends = time.monotonic() + timeout
            deadline = ends if deadline is None else min(deadline, ends)
        if deadline is None:
            self._sock.settimeout(None)
            return self._read_frame(max_frame, None)
        try:
            return self._read_frame(max_frame, deadline)
        finally:
            with contextlib.suppress(OSError):  # closed meanwhile: the read's own error says so
                self._sock.settimeout(timeout)  # the sends that follow get the caller's, not what was left

    def _read_frame(self, max_frame: int | None, deadline: float | None) -> Message:
        (length,) = _HEADER.unpack(self._recv_exact(_HEADER.size, deadline))
        return decode_body(self._recv_exact(_check_length(length, max_frame), deadline))

    def _recv_exact(self, n: int, deadline: float | None = None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no whole frame in the time allowed ({len(buf)} of {n} bytes came)")
                self._sock.settimeout(remaining)
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


def connect(
    address: str, *, secret: str, job_id: str, role: Role, timeout: float = 10.0, retry_s: float = 0.0
) -> Channel:
    """Connect to a coordinator; each side proves to the other that it holds the job's secret.

    The TCP connection must open within `timeout`; the exchange that follows (challenge, hello, welcome)
    must end within HANDSHAKE_TIMEOUT_S in all, as on the server's side. With `retry_s`, a connection
    refused, reset, closed or timed out during the handshake (a coordinator starting, or evicting
    handshakes under a flood of idle connections) is tried again, with backoff, for that long. A failed
    proof (AuthError) or a malformed answer (ProtocolError) is never retried.
    """
    deadline = time.monotonic() + retry_s
    pause = 0.05
    while True:
        try:
            return _connect_once(address, secret, job_id, role, timeout)
        except OSError:  # ConnectionError, TimeoutError included
            if time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def answers(address: str, timeout: float = 2.0) -> bool:
    """Whether a connection to `address` opens now (nothing is sent): a coordinator that is still there."""
    try:
        _open_socket(address, timeout).close()
    except OSError:
        return False
    return True


def unix_path(address: str) -> str:
    """The socket path of `unix:PATH`; `unix:@NAME` names an abstract socket (Linux: no file at all)."""
    path = address.removeprefix(UNIX_PREFIX)
    return "\0" + path[1:] if path.startswith("@") else path


def _open_socket(address: str, timeout: float) -> socket.socket:
    """A TCP connection to HOST:PORT, or to the Unix socket of `unix:PATH` (a node's store relay)."""
    if address.startswith(UNIX_PREFIX):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(unix_path(address))
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(parse_address(address), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect_once(address: str, secret: str, job_id: str, role: Role, timeout: float) -> Channel:
    sock = _open_socket(address, timeout)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S  # one bound for the whole exchange, never one per read
    channel = Channel(sock)
    try:
        challenge = _recv_unauthenticated(channel, deadline, address, "challenge")
        if not isinstance(challenge, Challenge):
            raise ProtocolError(f"expected a challenge from {address}, got {challenge.type!r}")
        if challenge.job_id != job_id:  # its job id is a stranger's text until it proves the secret: not quoted
            raise AuthError(f"{address} serves another job, not {job_id!r}")
        mine = secrets.token_hex(16)
        hello = Hello(role=role, job_id=job_id, nonce=mine, proof=proof(secret, challenge.nonce, role, job_id))
        channel.send(hello)
        answer = _recv_unauthenticated(channel, deadline, address, "welcome")
        if isinstance(answer, Refused):  # its reason is not quoted: the coordinator only ever gives this one
            raise AuthError(f"coordinator {address} refused the connection: bad job secret")
        if not isinstance(answer, Welcome):
            raise ProtocolError(f"expected welcome from {address}, got {answer.type!r}")
        expected = server_proof(secret, mine, challenge.nonce, role, job_id)
        if not hmac.compare_digest(expected, answer.proof):
            raise AuthError(
                f"{address} could not prove that it holds job {job_id!r}'s secret: not its coordinator "
                "(a stale address taken over by another process?)"
            )
    except BaseException:
        channel.close()
        raise
    sock.settimeout(None)
    return channel


def _recv_unauthenticated(channel: Channel, deadline: float, address: str, what: str) -> Message:
    """One handshake frame from a server that has not proved the secret: small, by `deadline`, and quoted
    in no error (a malformed one names only what was expected)."""
    try:
        return channel.recv(max_frame=PREAUTH_MAX_FRAME, deadline=deadline)
    except InvalidMessage:
        raise ProtocolError(f"malformed {what} from {address}") from None
    except TimeoutError:
        raise TimeoutError(
            f"no {what} from {address} within the handshake timeout of {HANDSHAKE_TIMEOUT_S:g} s"
        ) from None


def request(address: str, msg: BaseModel, *, secret: str, job_id: str, timeout: float = 10.0) -> Message:
    """One request, one reply, as a `client` (status, drain...); the whole reply within `timeout`."""
    channel = connect(address, secret=secret, job_id=job_id, role="client", timeout=timeout)
    try:
        channel.send(msg)
        return channel.recv(timeout=timeout)
    finally:
        channel.close()


# --- asyncio side: the coordinator ------------------------------------------------------------------


async def read_body(reader: asyncio.StreamReader, max_frame: int | None = None) -> bytes:
    """The next frame's body, not yet decoded (a relay decides from it what to hand on)."""
    (length,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return await reader.readexactly(_check_length(length, max_frame))


async def read_message(reader: asyncio.StreamReader, max_frame: int | None = None) -> Message:
    return decode_body(await read_body(reader, max_frame))


class FrameSink(Protocol):
    """Where frames go: an asyncio.StreamWriter, or a relayed worker's (coordinator.relayed)."""

    def write(self, data: bytes) -> None: ...


def write_message(writer: FrameSink, msg: BaseModel) -> None:
    writer.write(encode_frame(msg))


async def open_peer(
    address: str, secret: str, job_id: str, role: Role
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The client side of the handshake on asyncio (a node's store relay, the benchmarks' simulated peers):
    a TCP connection in `role` that proved the secret and checked the coordinator's proof, all within
    HANDSHAKE_TIMEOUT_S."""
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            challenge = await read_message(reader, PREAUTH_MAX_FRAME)
            if not isinstance(challenge, Challenge) or challenge.job_id != job_id:
                raise AuthError(f"{address} is not job {job_id!r}'s coordinator")
            mine = secrets.token_hex(16)
            nonce = challenge.nonce
            write_message(writer, Hello(role=role, job_id=job_id, nonce=mine, proof=proof(secret, nonce, role, job_id)))
            welcome = await read_message(reader, PREAUTH_MAX_FRAME)
        expected = server_proof(secret, mine, nonce, role, job_id)
        if not isinstance(welcome, Welcome) or not hmac.compare_digest(expected, welcome.proof):
            raise AuthError(f"{address} did not prove job {job_id!r}'s secret")
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def accept_handshake(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, secret: str, job_id: str
) -> Role:
    """Run the server side of the handshake, all of it within HANDSHAKE_TIMEOUT_S; returns the client's role
    or raises HandshakeRefused, whose category (one of REFUSAL_CATEGORIES) is all it says about the peer.
    A connection closed or reset by the peer raises ConnectionError or IncompleteReadError, as any read."""
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            return await _handshake(reader, writer, secret, job_id)
    except TimeoutError:
        raise HandshakeRefused("timeout") from None


async def _handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: str, job_id: str) -> Role:
    nonce = secrets.token_hex(16)
    write_message(writer, Challenge(job_id=job_id, nonce=nonce))
    await writer.drain()
    hello = await _read_hello(reader)
    if not isinstance(hello, Hello):
        raise HandshakeRefused("not a hello")
    if hello.job_id != job_id or not hmac.compare_digest(proof(secret, nonce, hello.role, job_id), hello.proof):
        write_message(writer, Refused(reason="bad job secret"))
        await writer.drain()
        raise HandshakeRefused("wrong job" if hello.job_id != job_id else "bad proof")
    write_message(writer, Welcome(proof=server_proof(secret, hello.nonce, nonce, hello.role, job_id)))
    await writer.drain()
    return hello.role


async def _read_hello(reader: asyncio.StreamReader) -> Message:
    """The client's one frame before it is authenticated: at most PREAUTH_MAX_FRAME bytes (a longer header
    ends the connection before the body is read), and no word of it in the error."""
    (length,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if length > PREAUTH_MAX_FRAME:
        raise HandshakeRefused("oversized frame")
    try:
        return parse_message(await reader.readexactly(length))
    except ValidationError:
        raise HandshakeRefused("malformed hello") from None


class HandshakeGate:
    """Bounds the connections that have not yet authenticated: past `limit`, a new one evicts the oldest.

    An honest client finishes its handshake within a round trip or two; a connection that idles in its
    handshake is what gets evicted, so a flood of idle connections can hold neither file descriptors nor
    memory, and cannot lock honest clients out for the handshake timeout as a plain cap would.
    """

    def __init__(self, limit: int = MAX_PENDING_HANDSHAKES) -> None:
        self.limit = limit
        self._pending: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self.evicted = 0

    def enter(self, writer: asyncio.StreamWriter) -> None:
        while len(self._pending) >= self.limit:
            oldest, _ = self._pending.popitem(last=False)
            oldest.transport.abort()
            self.evicted += 1
        self._pending[writer] = None

    def leave(self, writer: asyncio.StreamWriter) -> None:
        self._pending.pop(writer, None)

    def abort_all(self) -> None:
        while self._pending:
            self._pending.popitem()[0].transport.abort()

    def __len__(self) -> int:
        return len(self._pending)
