"""The rendezvous store served on the coordinator's asyncio loop, to connections that proved the job's
secret with the role "store". It carries out `KeyValueState`'s outcomes: replies, parked calls, timers.

A call blocked on missing keys is parked, never polled: it is applied again when one of its keys is
written, when the store is pruned (a call on a dropped generation then fails at once), or it fails when
its own timeout ends. Each connection may park at most `max_parked` calls; a request is answered (or
parked) before the next one of its connection is read, and replies carry the request's id.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
from collections import Counter

from slurm_elastic.errors import ProtocolError
from slurm_elastic.rendezvous.keyspace import Blocked, Call, Done, Failed, KeyValueState, Limits, Outcome
from slurm_elastic.wire.channel import read_message, write_message
from slurm_elastic.wire.messages import StoreReply, StoreRequest

__all__ = ["StoreService", "decode_value", "encode_value"]

MAX_PARKED = 256


def encode_value(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def decode_value(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"store value {text[:40]!r} is not base64") from None


class _Connection:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.parked: set[_Parked] = set()


class _Parked:
    __slots__ = ("call", "conn", "keys", "request", "seq", "timer")

    def __init__(self, seq: int, conn: _Connection, request: StoreRequest, call: Call, keys: tuple[str, ...]) -> None:
        self.seq, self.conn, self.request, self.call, self.keys = seq, conn, request, call, keys
        self.timer: asyncio.TimerHandle | None = None


class StoreService:
    def __init__(self, prefix: str, limits: Limits | None = None, max_parked: int = MAX_PARKED) -> None:
        self.state = KeyValueState(prefix, limits)
        self.max_parked = max_parked
        self._waiting: dict[str, set[_Parked]] = {}  # a missing key -> the calls parked on it
        self._seq = itertools.count()
        self._connections: set[_Connection] = set()
        self.served: Counter[str] = Counter()  # requests by op, since the start: what forming groups costs

    @property
    def parked(self) -> int:
        return len({p for ps in self._waiting.values() for p in ps})

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one authenticated store connection until it closes."""
        conn = _Connection(writer)
        self._connections.add(conn)
        try:
            while True:
                message = await read_message(reader)
                if not isinstance(message, StoreRequest):
                    raise ProtocolError(f"a store connection may send store requests only, not {message.type!r}")
                self._request(conn, message)
                await writer.drain()  # a client that does not read its replies stops being read
        finally:
            self._connections.discard(conn)
            for parked in list(conn.parked):
                self._unpark(parked)

    def close(self) -> None:
        """Close every store connection (the coordinator is stopping)."""
        for conn in list(self._connections):
            conn.writer.close()

    def prune(self, below: int) -> list[int]:
        """Drop generations older than `below`; calls parked on their keys fail now."""
        gone = self.state.prune(below)
        if gone:
            self._retry({p for ps in self._waiting.values() for p in ps})
        return gone

    # --- effects of one call ----------------------------------------------------------------------------

    def _request(self, conn: _Connection, request: StoreRequest) -> None:
        self.served[request.op] += 1
        try:
            call = Call(request.op, tuple(request.keys), tuple(decode_value(v) for v in request.values), request.amount)
        except ProtocolError as exc:
            self._reply(conn, StoreReply(id=request.id, ok=False, error=str(exc)))
            return
        self._settle(conn, request, call, self.state.apply(call))

    def _settle(self, conn: _Connection, request: StoreRequest, call: Call, outcome: Outcome) -> None:
        match outcome:
            case Done():
                values = [encode_value(v) for v in outcome.values]
                self._reply(conn, StoreReply(id=request.id, values=values, number=outcome.number))
                if outcome.written:
                    self._wake(outcome.written)
            case Failed():
                self._reply(conn, StoreReply(id=request.id, ok=False, error=outcome.error[:2000]))
            case Blocked():
                self._park(conn, request, call, outcome.keys)

    def _park(self, conn: _Connection, request: StoreRequest, call: Call, keys: tuple[str, ...]) -> None:
        if request.timeout_ms == 0:
            self._reply(conn, _timed_out(request, keys))
            return
        if len(conn.parked) >= self.max_parked:
            error = f"store: {len(conn.parked)} calls of this connection already wait; the limit is {self.max_parked}"
            self._reply(conn, StoreReply(id=request.id, ok=False, error=error))
            return
        parked = _Parked(next(self._seq), conn, request, call, keys)
        parked.timer = asyncio.get_running_loop().call_later(request.timeout_ms / 1000, self._expire, parked)
        conn.parked.add(parked)
        for key in keys:
            self._waiting.setdefault(key, set()).add(parked)

    def _unpark(self, parked: _Parked) -> None:
        if parked.timer is not None:
            parked.timer.cancel()
        parked.conn.parked.discard(parked)
        for key in parked.keys:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(parked)
                if not waiting:
                    del self._waiting[key]

    def _expire(self, parked: _Parked) -> None:
        self._unpark(parked)
        self._reply(parked.conn, _timed_out(parked.request, parked.keys))

    def _wake(self, keys: tuple[str, ...]) -> None:
        self._retry({p for key in keys for p in self._waiting.get(key, ())})

    def _retry(self, parked: set[_Parked]) -> None:
        for p in sorted(parked, key=lambda p: p.seq):  # in the order they were parked
            self._unpark(p)
            outcome = self.state.apply(p.call)  # blocking calls write nothing: no cascade
            if isinstance(outcome, Blocked):
                self._park_again(p, outcome.keys)
            else:
                self._settle(p.conn, p.request, p.call, outcome)

    def _park_again(self, parked: _Parked, keys: tuple[str, ...]) -> None:
        parked.keys = keys
        loop = asyncio.get_running_loop()
        assert parked.timer is not None
        remaining = max(0.0, parked.timer.when() - loop.time())
        parked.timer = loop.call_later(remaining, self._expire, parked)
        parked.conn.parked.add(parked)
        for key in keys:
            self._waiting.setdefault(key, set()).add(parked)

    def _reply(self, conn: _Connection, reply: StoreReply) -> None:
        if not conn.writer.is_closing():
            write_message(conn.writer, reply)


def _timed_out(request: StoreRequest, keys: tuple[str, ...]) -> StoreReply:
    shown = ", ".join(repr(k[:200]) for k in keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    seconds = request.timeout_ms / 1000
    error = f"store {request.op}: timed out after {seconds:g} s waiting for {shown}"
    return StoreReply(id=request.id, ok=False, error=error)
