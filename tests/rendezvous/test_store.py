"""The rendezvous store end to end: torch Store clients (`CoordinatorStore`) of a real coordinator on
127.0.0.1, gloo groups formed through it, waits served without polling, generations pruned, impostors
refused. Every coordinator, client and thread is stopped by its test."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.driver import STORE_PREFIX
from slurm_elastic.rendezvous.client import CoordinatorStore
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

from .conftest import JOB, key

pytestmark = pytest.mark.timeout(60)


@contextlib.contextmanager
def client(coordinator: tuple[CoordinatorThread, str], timeout_s: float = 10.0) -> Iterator[CoordinatorStore]:
    thread, secret = coordinator
    store = CoordinatorStore(thread.address, secret, JOB, timeout_s)
    try:
        yield store
    finally:
        store.close()


def test_the_torch_store_calls(coordinator: tuple[CoordinatorThread, str]) -> None:
    with client(coordinator) as a, client(coordinator) as b:
        a.set(key(1, "x"), b"\x00\xffbytes")
        assert b.get(key(1, "x")) == b"\x00\xffbytes"
        assert a.add(key(1, "n"), 2) == 2 and b.add(key(1, "n"), 3) == 5
        assert b.compare_set(key(1, "c"), b"", b"v") == b"v"
        assert a.compare_set(key(1, "c"), b"w", b"z") == b"v"
        assert a.check([key(1, "x"), key(1, "c")]) and not a.check([key(1, "nope")])
        a.append(key(1, "x"), "!")
        a.multi_set([key(1, "m1"), key(1, "m2")], [b"1", "2"])
        assert b.multi_get([key(1, "m2"), key(1, "x")]) == [b"2", b"\x00\xffbytes!"]
        assert a.num_keys() == 5 and sorted(a.list_keys())[0] == key(1, "c")
        assert b.delete_key(key(1, "m1")) and not b.delete_key(key(1, "m1"))
        b.wait([key(1, "x")], datetime.timedelta(seconds=1))
        clone = a.clone()
        assert clone.get(key(1, "m2")) == b"2"
    assert clone.closed  # closed with the store it was cloned from


def test_a_get_waits_on_the_coordinator_until_the_key_is_set(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, _ = coordinator
    got: list[bytes] = []
    with client(coordinator) as waiter, client(coordinator) as writer:
        reader = threading.Thread(target=lambda: got.append(waiter.get(key(1, "late"))))
        reader.start()
        deadline = time.monotonic() + 5
        while thread.call(lambda: thread.coordinator.store.parked) != 1:  # parked, not polling
            assert time.monotonic() < deadline
            time.sleep(0.01)
        writer.set(key(1, "late"), b"here")
        reader.join(5)
    assert got == [b"here"]
    assert thread.call(lambda: thread.coordinator.store.parked) == 0


def test_a_wait_times_out_with_the_keys_named(coordinator: tuple[CoordinatorThread, str]) -> None:
    with client(coordinator) as store:
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError, match=r"store wait: timed out after 0.2 s waiting for 'rdzv/g1/a'"):
            store.wait([key(1, "a")], datetime.timedelta(seconds=0.2))
        assert time.monotonic() - started < 2


def test_a_newer_generation_fails_the_calls_waiting_on_an_older_one(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, _ = coordinator
    errors: list[BaseException] = []
    with client(coordinator) as store:
        store.set(key(1, "kept"), b"1")

        def wait() -> None:
            try:
                store.get(key(1, "never"))
            except dist.DistStoreError as exc:
                errors.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        while thread.call(lambda: thread.coordinator.store.parked) != 1:
            time.sleep(0.01)
        assert thread.call(thread.coordinator.store.prune, 2) == [1]
        waiter.join(5)
        assert len(errors) == 1 and "belongs to generation 1, which is over" in str(errors[0])
        with pytest.raises(dist.DistStoreError, match="generation 1, which is over"):
            store.set(key(1, "late"), b"x")
        assert store.num_keys() == 0


def test_closing_a_client_fails_its_blocked_call_at_once(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    store = CoordinatorStore(thread.address, secret, JOB, 30.0)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            store.get(key(1, "never"))
        except dist.DistStoreError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    store.close()
    waiter.join(5)
    assert not waiter.is_alive() and time.monotonic() - started < 1
    assert "closed" in str(errors[0])
    deadline = time.monotonic() + 5
    while thread.call(lambda: thread.coordinator.store.parked) != 0:  # the coordinator forgets it too
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_limits_are_reported_to_the_caller(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, _ = coordinator
    with client(coordinator) as store:
        with pytest.raises(dist.DistStoreError, match=r"a value of 8388609 bytes exceeds the limit of 8388608"):
            store.set(key(1, "big"), b"x" * (8 * 1024 * 1024 + 1))
        thread.call(setattr, thread.coordinator.store, "max_parked", 1)
        waiter = threading.Thread(target=store.wait, args=([key(1, "b")],), daemon=True)
        waiter.start()
        while thread.call(lambda: thread.coordinator.store.parked) != 1:
            time.sleep(0.01)
        with pytest.raises(dist.DistStoreError, match="1 calls of this connection already wait; the limit is 1"):
            store.wait([key(1, "c")], datetime.timedelta(seconds=1))
        store.set(key(1, "b"), b"")
        waiter.join(5)
        assert not waiter.is_alive()


def test_gloo_groups_of_100_generations_hold_the_keys_of_one(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    world = 3
    counts: dict[int, int] = {}
    for generation in range(1, 101):
        thread.call(thread.coordinator.store.prune, generation)  # what announcing it does
        stores = [CoordinatorStore(thread.address, secret, JOB, 20.0) for _ in range(world)]
        sums: dict[int, float] = {}

        def rank(
            r: int, g: int = generation, stores: list[CoordinatorStore] = stores, sums: dict[int, float] = sums
        ) -> None:
            prefixed = dist.PrefixStore(f"{STORE_PREFIX}/g{g}", stores[r])
            pg = dist.ProcessGroupGloo(prefixed, r, world, datetime.timedelta(seconds=20))
            t = torch.tensor([float(r + g)])
            pg.allreduce([t]).wait()
            sums[r] = t.item()

        ranks = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(30)
        for s in stores:
            s.close()
        assert sums == {r: float(3 * generation + 3) for r in range(world)}
        counts[generation] = thread.call(lambda: thread.coordinator.store.state.count)
    assert counts[100] == counts[5] > 0


def test_a_store_client_refuses_an_impostor_coordinator() -> None:
    """A process that took over the coordinator's port answers like one but cannot prove the secret."""

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ch.write_message(writer, msg.Challenge(job_id=JOB, nonce="ab" * 16))
        await writer.drain()
        await ch.read_message(reader)
        ch.write_message(writer, msg.Welcome(proof="0" * 64))
        await writer.drain()
        await reader.read()
        writer.close()

    async def main() -> BaseException | None:
        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        try:
            address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
            try:
                await asyncio.to_thread(CoordinatorStore, address, ch.new_secret(), JOB, 5.0)
            except dist.DistStoreError as exc:
                return exc
            return None
        finally:
            server.close()
            await server.wait_closed()

    error = asyncio.run(main())
    assert error is not None and "could not prove that it holds job 'store-test''s secret" in str(error)


def test_a_store_connection_carries_store_calls_only(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    channel = ch.connect(thread.address, secret=secret, job_id=JOB, role="store", timeout=5)
    try:
        channel.send(msg.StatusRequest())
        with pytest.raises(ConnectionError):
            channel.recv(timeout=5)
    finally:
        channel.close()
    refused = [e["reason"] for e in thread.coordinator.events.all() if e["event"] == "connection_refused"]
    assert refused == ["a store connection may send store requests only, not 'status'"]
