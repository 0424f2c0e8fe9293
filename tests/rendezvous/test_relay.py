"""A node's store relay between torch Store clients and a real coordinator: every call behaves as it does
direct, identical reads in flight together reach the coordinator once, gloo groups form through relays,
strangers are refused, and a lost coordinator fails the calls in flight at once. Every coordinator, relay,
client and thread is stopped by its test."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.driver import STORE_PREFIX
from slurm_elastic.rendezvous.client import CoordinatorStore
from slurm_elastic.rendezvous.relay import RelayThread
from slurm_elastic.wire import channel as ch

from .conftest import JOB, key

pytestmark = pytest.mark.timeout(60)


@contextlib.contextmanager
def relay(coordinator: tuple[CoordinatorThread, str], secret: str | None = None) -> Iterator[RelayThread]:
    thread, job_secret = coordinator
    running = RelayThread(thread.address, secret or job_secret, JOB).start()
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def client(address: str, secret: str, timeout_s: float = 10.0) -> Iterator[CoordinatorStore]:
    store = CoordinatorStore(address, secret, JOB, timeout_s)
    try:
        yield store
    finally:
        store.close()


def served(thread: CoordinatorThread, op: str) -> int:
    return thread.call(lambda: thread.coordinator.store.served[op])


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_every_torch_store_call_through_the_relay(coordinator: tuple[CoordinatorThread, str]) -> None:
    _, secret = coordinator
    with relay(coordinator) as node, client(node.address, secret) as a, client(node.address, secret) as b:
        assert node.address.startswith("unix:")
        a.set(key(1, "x"), b"\x00\xffbytes")
        assert b.get(key(1, "x")) == b"\x00\xffbytes"
        assert a.add(key(1, "n"), 2) == 2 and b.add(key(1, "n"), 3) == 5  # adds are never merged
        assert b.compare_set(key(1, "c"), b"", b"v") == b"v"
        assert a.compare_set(key(1, "c"), b"w", b"z") == b"v"
        assert a.check([key(1, "x"), key(1, "c")]) and not a.check([key(1, "nope")])
        a.append(key(1, "x"), "!")
        a.multi_set([key(1, "m1"), key(1, "m2")], [b"1", "2"])
        assert b.multi_get([key(1, "m2"), key(1, "x")]) == [b"2", b"\x00\xffbytes!"]
        assert a.num_keys() == 5
        assert b.delete_key(key(1, "m1")) and not b.delete_key(key(1, "m1"))
        b.wait([key(1, "x")], datetime.timedelta(seconds=1))
        with pytest.raises(dist.DistStoreError, match="timed out"):
            a.wait([key(1, "never")], datetime.timedelta(milliseconds=200))
        assert a.clone().get(key(1, "m2")) == b"2"


def test_reads_in_flight_together_reach_the_coordinator_once(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    readers = 6
    with relay(coordinator) as node, contextlib.ExitStack() as stack:
        stores = [stack.enter_context(client(node.address, secret)) for _ in range(readers)]
        got: list[bytes] = []
        threads = [threading.Thread(target=lambda s=s: got.append(s.get(key(1, "uid")))) for s in stores]
        gets_before = served(thread, "get")
        for t in threads:
            t.start()
        relayed = node.relay
        assert relayed is not None
        eventually(lambda: relayed.upstream is not None and relayed.upstream.merged == readers - 1, "reads merged")
        assert thread.call(lambda: thread.coordinator.store.parked) == 1  # one read waits at the coordinator
        with client(thread.address, secret) as writer:  # rank 0 of another node, direct
            writer.set(key(1, "uid"), b"unique-id")
        for t in threads:
            t.join(10)
        assert got == [b"unique-id"] * readers
        assert served(thread, "get") - gets_before == 1
        # A read that comes after the shared one was answered goes upstream again.
        assert stores[0].get(key(1, "uid")) == b"unique-id"
        assert served(thread, "get") - gets_before == 2


def test_gloo_groups_form_through_two_nodes_relays(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    world = 4
    groups: list[object] = [None] * world
    with relay(coordinator) as first, relay(coordinator) as second, contextlib.ExitStack() as stack:
        stores = [stack.enter_context(client((first, second)[r // 2].address, secret, 30)) for r in range(world)]

        def form(rank: int) -> None:
            scoped = dist.PrefixStore(f"{STORE_PREFIX}/g1", stores[rank])
            group = dist.ProcessGroupGloo(scoped, rank, world, datetime.timedelta(seconds=30))
            tensor = torch.tensor([float(rank + 1)])
            group.allreduce([tensor]).wait()
            groups[rank] = tensor.item()

        before = sum(thread.call(lambda: dict(thread.coordinator.store.served)).values())
        threads = [threading.Thread(target=form, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ops = sum(thread.call(lambda: dict(thread.coordinator.store.served)).values()) - before
    assert groups == [10.0] * world
    # Never more than the same groups cost the coordinator direct; fewer only where identical reads overlap
    # in time, which a loaded machine may not give (the coalescing itself is checked above).
    assert 0 < ops <= world + 2 * world * world


def test_the_relay_refuses_a_client_without_the_secret(coordinator: tuple[CoordinatorThread, str]) -> None:
    with relay(coordinator) as node, pytest.raises(dist.DistStoreError, match=r"refused|prove|secret"):
        CoordinatorStore(node.address, ch.new_secret(), JOB, 2.0)


def test_a_relay_without_the_secret_serves_nothing(coordinator: tuple[CoordinatorThread, str]) -> None:
    wrong = ch.new_secret()
    # Its workers hold its secret, and the coordinator refuses it: their calls fail, none hangs.
    with (
        relay(coordinator, secret=wrong) as node,
        pytest.raises(dist.DistStoreError),
        client(node.address, wrong, 2.0) as store,
    ):
        store.get(key(1, "x"))


def test_a_lost_coordinator_fails_the_calls_in_flight_at_once(coordinator: tuple[CoordinatorThread, str]) -> None:
    thread, secret = coordinator
    errors: list[BaseException] = []
    with relay(coordinator) as node, client(node.address, secret, 30) as store:
        waiter = threading.Thread(target=lambda: _catch(errors, lambda: store.get(key(1, "never"))))
        waiter.start()
        eventually(lambda: thread.call(lambda: thread.coordinator.store.parked) == 1, "the read parked")
        stopped = time.monotonic()
        thread.stop()
        waiter.join(20)
        assert not waiter.is_alive() and time.monotonic() - stopped < 15  # not the call's 30 s timeout
    assert len(errors) == 1 and isinstance(errors[0], dist.DistStoreError)


def test_the_relay_socket_is_abstract_and_gone_with_it(coordinator: tuple[CoordinatorThread, str]) -> None:
    _, secret = coordinator
    with relay(coordinator) as node:
        assert node.address.startswith("unix:@")  # no file: nothing to plant, nothing left by a killed agent
        name = "@" + node.address.removeprefix("unix:@")
        with open("/proc/net/unix") as table:
            assert name in table.read()
    with open("/proc/net/unix") as table:
        assert name not in table.read()
    with pytest.raises(dist.DistStoreError, match="cannot reach"):
        CoordinatorStore(node.address, secret, JOB, 0.5)


def _catch(errors: list[BaseException], call: Callable[[], object]) -> None:
    try:
        call()
    except BaseException as exc:
        errors.append(exc)
