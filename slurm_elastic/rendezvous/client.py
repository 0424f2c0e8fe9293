"""A torch Store whose keys live in the job's coordinator, reached over one connection authenticated
with the job's secret (role "store"). ProcessGroupGloo and ProcessGroupNCCL take it as they take a
TCPStore; nothing of the job listens without authentication.

Calls of several threads share the connection: each request carries an id and a reader thread hands
each reply to its caller. Blocking calls (get, wait, multi_get) wait on the coordinator, which answers
when the keys exist or the call's timeout ends; the client only bounds how long it waits for that answer.
Errors are `torch.distributed.DistStoreError`, as TCPStore raises.
"""

from __future__ import annotations

import datetime
import itertools
import threading
from collections.abc import Sequence

import torch.distributed as dist

from slurm_elastic.errors import AuthError, ProtocolError
from slurm_elastic.rendezvous.service import decode_value, encode_value
from slurm_elastic.wire.channel import Channel, connect
from slurm_elastic.wire.messages import StoreOp, StoreReply, StoreRequest

__all__ = ["CoordinatorStore"]

REPLY_GRACE_S = 5.0  # beyond a call's own timeout, for the coordinator's answer to arrive
CONNECT_TIMEOUT_S = 30.0


class _Pending:
    __slots__ = ("done", "error", "reply")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: StoreReply | None = None
        self.error: str | None = None


def _connect(address: str, secret: str, job_id: str, timeout_s: float) -> Channel:
    """Connect and authenticate, retrying refused or reset connections until `timeout_s` (see
    wire.channel.connect); an impostor is never retried."""
    try:
        return connect(address, secret=secret, job_id=job_id, role="store", timeout=10.0, retry_s=timeout_s)
    except AuthError as exc:
        raise dist.DistStoreError(f"rendezvous store at {address}: {exc}") from None
    except (OSError, ProtocolError) as exc:
        raise dist.DistStoreError(f"cannot reach the rendezvous store at {address}: {exc}") from None


def _bytes(value: str | bytes | Sequence[int]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _seconds(timeout: datetime.timedelta | None, default: float) -> float:
    if timeout is None or timeout.total_seconds() <= 0:  # torch's kNoTimeout (0) means the store's own
        return default
    return timeout.total_seconds()


class CoordinatorStore(dist.Store):
    def __init__(self, address: str, secret: str, job_id: str, timeout_s: float) -> None:
        super().__init__()
        self.set_timeout(datetime.timedelta(seconds=timeout_s))
        self._args = (address, secret, job_id, timeout_s)
        self._channel = _connect(address, secret, job_id, min(timeout_s, CONNECT_TIMEOUT_S))
        self._lock = threading.Lock()
        self._calls: dict[int, _Pending] = {}
        self._ids = itertools.count()
        self._closed: str | None = None
        self._clones: list[CoordinatorStore] = []
        self._reader = threading.Thread(target=self._read_loop, name="se-store", daemon=True)
        self._reader.start()

    # --- torch's Store ----------------------------------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", [key], [_bytes(value)])

    def get(self, key: str) -> bytes:
        return self._call("get", [key], wait_s=self._timeout_s()).values_[0]

    def add(self, key: str, amount: int) -> int:
        return self._call("add", [key], amount=amount).number

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self._call("compare_set", [key], [_bytes(expected_value), _bytes(desired_value)]).values_[0]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._call("wait", list(keys), wait_s=_seconds(timeout, self._timeout_s()))

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys)).number)

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", [key]).number)

    def num_keys(self) -> int:
        return self._call("num_keys").number

    def append(self, key: str, value: str | bytes) -> None:
        self._call("append", [key], [_bytes(value)])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return list(self._call("multi_get", list(keys), wait_s=self._timeout_s()).values_)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self._call("multi_set", list(keys), [_bytes(v) for v in values])

    def has_extended_api(self) -> bool:
        return True

    def list_keys(self) -> list[str]:
        return [v.decode() for v in self._call("list_keys").values_]

    def clone(self) -> CoordinatorStore:
        """A client of its own connection (torch clones a store for another thread); closed with this one."""
        clone = CoordinatorStore(*self._args)
        with self._lock:
            self._clones.append(clone)
        return clone

    # --- life cycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection and its clones'; calls in flight fail at once (a generation that was abandoned)."""
        self._fail_all("the store client was closed")
        self._channel.close()
        with self._lock:
            clones, self._clones = self._clones, []
        for clone in clones:
            clone.close()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # --- requests and replies -------------------------------------------------------------------------

    def _timeout_s(self) -> float:
        timeout: datetime.timedelta = self.timeout  # type: ignore[attr-defined]  # the C++ Store's, set_timeout's
        return timeout.total_seconds()

    def _call(
        self,
        op: StoreOp,
        keys: list[str] | None = None,
        values: list[bytes] | None = None,
        *,
        amount: int = 0,
        wait_s: float | None = None,
    ) -> _Reply:
        pending = _Pending()
        with self._lock:
            if self._closed is not None:
                raise dist.DistStoreError(f"store {op}: {self._closed}")
            rid = next(self._ids)
            self._calls[rid] = pending
        request = StoreRequest(
            id=rid,
            op=op,
            keys=keys or [],
            values=[encode_value(v) for v in values or []],
            amount=amount,
            timeout_ms=round((wait_s or 0.0) * 1000),
        )
        try:
            self._channel.send(request)
        except OSError as exc:
            self._fail_all(f"connection to the coordinator's store lost: {exc}")
        bound = (wait_s if wait_s is not None else self._timeout_s()) + REPLY_GRACE_S
        if not pending.done.wait(bound):
            with self._lock:
                self._calls.pop(rid, None)
            raise dist.DistStoreError(f"store {op}: no answer from the coordinator within {bound:g} s")
        if pending.error is not None:
            raise dist.DistStoreError(f"store {op}: {pending.error}")
        reply = pending.reply
        assert reply is not None
        if not reply.ok:
            raise dist.DistStoreError(reply.error)
        return _Reply(tuple(decode_value(v) for v in reply.values), reply.number)

    def _read_loop(self) -> None:
        while True:
            try:
                message = self._channel.recv()
            except (OSError, ConnectionError, ProtocolError) as exc:
                self._fail_all(f"connection to the coordinator's store lost: {exc}")
                return
            if not isinstance(message, StoreReply):
                self._fail_all(f"the coordinator sent {message.type!r} on a store connection")
                self._channel.close()
                return
            with self._lock:
                pending = self._calls.pop(message.id, None)
            if pending is not None:
                pending.reply = message
                pending.done.set()

    def _fail_all(self, why: str) -> None:
        with self._lock:
            if self._closed is None:
                self._closed = why
            calls, self._calls = self._calls, {}
        for pending in calls.values():
            pending.error = why
            pending.done.set()


class _Reply:
    __slots__ = ("number", "values_")

    def __init__(self, values: tuple[bytes, ...], number: int) -> None:
        self.values_ = values
        self.number = number
