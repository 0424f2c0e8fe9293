"""The rendezvous store's state machine: what one torch Store call does to a job's keys. Pure: no clock,
no socket, no asyncio; `service.py` carries it out on the coordinator's loop.

Keys live in namespaces: `<prefix>/g<N>/...` belongs to generation N, any other key to the job's shared
namespace. `prune(below)` drops every generation older than `below` (the coordinator calls it when it
announces a generation), so the store does not grow with membership changes, and a call that names a
dropped generation fails at once instead of waiting for its timeout. Limits bound the number of keys,
their size, the bytes held, and a reply: one whose frame would pass the wire's limit (a multi_get of the
same large key a thousand times) fails before any of it is built. A call past a limit fails with an error
that names it.

A call that needs keys that do not exist yet (get, wait, multi_get) is `Blocked` on them: the service
parks it and applies it again whenever one of those keys is written, or the store is pruned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Blocked", "Call", "Done", "Failed", "KeyValueState", "Limits", "Outcome", "Shared", "reply_frame_bytes"]

Op = Literal[
    "set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys", "append", "multi_get",
    "multi_set", "list_keys",
]  # fmt: skip


class Shared:
    """The namespace of keys outside any generation (there is one per job)."""

    def __repr__(self) -> str:
        return "shared"


SHARED = Shared()
Namespace = int | Shared


@dataclass(frozen=True)
class Limits:
    max_keys: int = 100_000
    max_key_bytes: int = 512
    max_value_bytes: int = 8 * 1024 * 1024  # as torch's TCPStore
    max_total_bytes: int = 256 * 1024 * 1024
    max_reply_bytes: int = 16 * 1024 * 1024  # wire.channel.MAX_FRAME: a longer reply could not be sent
    max_reply_values: int = 1024  # wire.messages.MAX_STORE_ITEMS, the values a StoreReply may carry


@dataclass(frozen=True)
class Call:
    op: Op
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()
    amount: int = 0


@dataclass(frozen=True)
class Done:
    values: tuple[bytes, ...] = ()
    number: int = 0
    written: tuple[str, ...] = ()  # keys whose value changed: their parked calls are applied again


@dataclass(frozen=True)
class Blocked:
    keys: tuple[str, ...]  # the missing keys the call waits for


@dataclass(frozen=True)
class Failed:
    error: str


Outcome = Done | Blocked | Failed

# (keys, values) each call takes: exactly, or None for "any number".
_SHAPE: dict[str, tuple[int | None, int | None]] = {
    "set": (1, 1),
    "get": (1, 0),
    "add": (1, 0),
    "compare_set": (1, 2),
    "wait": (None, 0),
    "check": (None, 0),
    "delete_key": (1, 0),
    "num_keys": (0, 0),
    "append": (1, 1),
    "multi_get": (None, 0),
    "multi_set": (None, None),
    "list_keys": (0, 0),
}


class StoreError(Exception):
    """Raised inside `apply` and turned into a `Failed` outcome."""


class KeyValueState:
    """The keys of one job, by namespace, within `limits`."""

    def __init__(self, prefix: str, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.floor = 0  # generations below it are gone
        self._generation = re.compile(re.escape(prefix) + r"/g([0-9]{1,18})/")
        self._spaces: dict[Namespace, dict[str, bytes]] = {}
        self.total_bytes = 0
        self.count = 0

    # --- reads ----------------------------------------------------------------------------------------

    def namespace(self, key: str) -> Namespace:
        match = self._generation.match(key)
        return int(match.group(1)) if match else SHARED

    def namespaces(self) -> list[Namespace]:
        return list(self._spaces)

    def lookup(self, key: str) -> bytes | None:
        return self._spaces.get(self.namespace(key), {}).get(key)

    # --- the one entry point --------------------------------------------------------------------------

    def apply(self, call: Call) -> Outcome:
        try:
            self._check_shape(call)
            for key in call.keys:
                self._check_key(key)
            return self._apply(call)
        except StoreError as exc:
            return Failed(str(exc))

    def prune(self, below: int) -> list[int]:
        """Drop every generation older than `below`; returns the generations dropped."""
        self.floor = max(self.floor, below)
        gone = sorted(ns for ns in self._spaces if isinstance(ns, int) and ns < self.floor)
        for ns in gone:
            space = self._spaces.pop(ns)
            self.count -= len(space)
            self.total_bytes -= sum(_size(k, v) for k, v in space.items())
        return gone

    # --- checks ---------------------------------------------------------------------------------------

    def _check_shape(self, call: Call) -> None:
        want_keys, want_values = _SHAPE[call.op]
        if want_keys is not None and len(call.keys) != want_keys:
            raise StoreError(f"store {call.op} takes {want_keys} key(s), got {len(call.keys)}")
        if want_values is not None and len(call.values) != want_values:
            raise StoreError(f"store {call.op} takes {want_values} value(s), got {len(call.values)}")
        if call.op == "multi_set" and len(call.keys) != len(call.values):
            raise StoreError(f"store multi_set got {len(call.keys)} keys but {len(call.values)} values")
        for value in call.values:
            if len(value) > self.limits.max_value_bytes:
                raise StoreError(
                    f"store {call.op}: a value of {len(value)} bytes exceeds the limit of {self.limits.max_value_bytes}"
                )

    def _check_key(self, key: str) -> None:
        if len(key.encode()) > self.limits.max_key_bytes:
            raise StoreError(f"store key {key[:80]!r}... exceeds the limit of {self.limits.max_key_bytes} bytes")
        ns = self.namespace(key)
        if isinstance(ns, int) and ns < self.floor:
            raise StoreError(
                f"store key {key[:200]!r} belongs to generation {ns}, which is over "
                f"(the store holds generation {self.floor} and later)"
            )

    # --- the calls ------------------------------------------------------------------------------------

    def _apply(self, call: Call) -> Outcome:
        op, keys, values = call.op, call.keys, call.values
        if op in ("get", "wait", "multi_get"):
            missing = tuple(k for k in keys if self.lookup(k) is None)
            if missing:
                return Blocked(missing)
            if op == "wait":
                return Done()
            return self._reply(op, [self._value(k) for k in keys])
        if op == "check":
            return Done(number=int(all(self.lookup(k) is not None for k in keys)))
        if op == "num_keys":
            return Done(number=self.count)
        if op == "list_keys":
            return self._reply(op, [k.encode() for space in self._spaces.values() for k in space])
        if op == "delete_key":
            return Done(number=int(self._delete(keys[0])))
        if op == "set":
            self._write([(keys[0], values[0])])
            return Done(written=keys)
        if op == "multi_set":
            self._write(list(zip(keys, values, strict=True)))
            return Done(written=keys)
        if op == "append":
            self._write([(keys[0], (self.lookup(keys[0]) or b"") + values[0])])
            return Done(written=keys)
        if op == "add":
            return self._add(keys[0], call.amount)
        return self._compare_set(keys[0], values[0], values[1])

    def _add(self, key: str, amount: int) -> Outcome:
        old = self.lookup(key)
        try:
            current = int(old.decode("ascii")) if old is not None else 0
        except (UnicodeDecodeError, ValueError):
            raise StoreError(f"store add: the value of {key[:200]!r} is not an integer") from None
        new = current + amount
        if not -(2**63) <= new < 2**63:
            raise StoreError(f"store add: {current} + {amount} overflows a 64-bit counter")
        self._write([(key, str(new).encode())])
        return Done(number=new, written=(key,))

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> Outcome:
        # torch's semantics: a missing key is set only when `expected` is empty; the answer is the value
        # now held (or `expected`, when a missing key was left alone).
        current = self.lookup(key)
        if current is None:
            if expected:
                return Done(values=(expected,))
            self._write([(key, desired)])
            return Done(values=(desired,), written=(key,))
        if current == expected:
            self._write([(key, desired)])
            return Done(values=(desired,), written=(key,))
        return Done(values=(current,))

    def _reply(self, op: Op, values: list[bytes]) -> Done:
        """The values a call returns (references to the stored ones: nothing is copied yet), or a failure
        when their reply could not be sent: refused here, before the service encodes any of it."""
        if len(values) > self.limits.max_reply_values:
            raise StoreError(
                f"store {op}: a reply of {len(values)} values exceeds the limit of {self.limits.max_reply_values}"
            )
        size = reply_frame_bytes(values)
        if size > self.limits.max_reply_bytes:
            raise StoreError(
                f"store {op}: the reply would be {size} bytes ({len(values)} values, base64), over the frame "
                f"limit of {self.limits.max_reply_bytes}; ask for fewer or smaller values per call"
            )
        return Done(values=tuple(values))

    # --- mutation -------------------------------------------------------------------------------------

    def _value(self, key: str) -> bytes:
        value = self.lookup(key)
        assert value is not None  # only called for keys just found
        return value

    def _write(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Set every item, or none when the result would pass a limit."""
        latest = dict(items)
        new_keys = [k for k in latest if self.lookup(k) is None]
        grow = sum(_size(k, v) for k, v in latest.items()) - sum(
            _size(k, old) for k in latest if (old := self.lookup(k)) is not None
        )
        if self.count + len(new_keys) > self.limits.max_keys:
            raise StoreError(f"store is full: {self.count} keys, the limit is {self.limits.max_keys}")
        if self.total_bytes + grow > self.limits.max_total_bytes:
            raise StoreError(
                f"store is full: {self.total_bytes} + {grow} bytes exceeds the limit of {self.limits.max_total_bytes}"
            )
        for key, value in latest.items():
            if len(value) > self.limits.max_value_bytes:
                raise StoreError(
                    f"store: a value of {len(value)} bytes for {key[:200]!r} exceeds the limit of "
                    f"{self.limits.max_value_bytes}"
                )
        for key, value in latest.items():
            self._spaces.setdefault(self.namespace(key), {})[key] = value
        self.count += len(new_keys)
        self.total_bytes += grow

    def _delete(self, key: str) -> bool:
        ns = self.namespace(key)
        space = self._spaces.get(ns, {})
        value = space.pop(key, None)
        if value is None:
            return False
        self.count -= 1
        self.total_bytes -= _size(key, value)
        if not space:
            del self._spaces[ns]
        return True


def _size(key: str, value: bytes) -> int:
    return len(key.encode()) + len(value)


REPLY_ENVELOPE_BYTES = 256  # a StoreReply's JSON besides its values: type, id, ok, number, an empty error


def reply_frame_bytes(values: Sequence[bytes]) -> int:
    """An upper bound on the JSON body of a StoreReply carrying `values`: each one base64-encoded (4 bytes per
    3, padded), quoted and comma-separated, plus the envelope."""
    return REPLY_ENVELOPE_BYTES + sum(4 * ((len(v) + 2) // 3) + 3 for v in values)
