"""A store reply is bounded before it is built: a call whose reply would pass the wire's frame limit (a
multi_get of the same 8 MiB key a thousand times: 11 GB of base64) fails with an error naming the limit,
and the coordinator never encodes any of it. The pure state machine, then a real coordinator on 127.0.0.1
with an authenticated torch Store client; every coordinator and client is stopped by its test."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.coordinator import CoordinatorConfig, CoordinatorThread
from slurm_elastic.rendezvous import service
from slurm_elastic.rendezvous.client import CoordinatorStore
from slurm_elastic.rendezvous.keyspace import Call, Done, Failed, KeyValueState, Limits, reply_frame_bytes
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

pytestmark = pytest.mark.timeout(120)
JOB = "reply-bound"
MIB = 1024 * 1024


def test_the_reply_limits_are_the_wires() -> None:
    assert Limits().max_reply_bytes == ch.MAX_FRAME
    assert Limits().max_reply_values == msg.MAX_STORE_ITEMS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3000), max_size=40), st.integers(0, 2**53), st.integers(-(2**63), 2**63 - 1))
def test_the_reply_size_is_an_upper_bound_of_the_frame(sizes: list[int], rid: int, number: int) -> None:
    values = [bytes(range(256)) * (n // 256) + b"\xff" * (n % 256) for n in sizes]
    reply = msg.StoreReply(id=rid, values=[service.encode_value(v) for v in values], number=number)
    assert len(reply.model_dump_json()) <= reply_frame_bytes(values)


def test_a_multi_get_whose_reply_would_pass_the_frame_limit_fails_naming_it() -> None:
    s = KeyValueState("rdzv", Limits(max_reply_bytes=1100))
    assert isinstance(s.apply(Call("set", ("k",), (b"x" * 300,))), Done)
    assert isinstance(s.apply(Call("multi_get", ("k", "k"))), Done)  # 2 * 400 of base64 and the envelope: fits
    outcome = s.apply(Call("multi_get", ("k",) * 3))
    assert isinstance(outcome, Failed)
    assert outcome.error == (
        "store multi_get: the reply would be 1465 bytes (3 values, base64), over the frame limit of 1100; "
        "ask for fewer or smaller values per call"
    )
    assert isinstance(s.apply(Call("get", ("k",))), Done)  # the store goes on


def test_list_keys_past_a_replys_values_fails_instead_of_breaking_the_connection() -> None:
    s = KeyValueState("rdzv", Limits(max_reply_values=5))
    s.apply(Call("multi_set", tuple(f"k{i}" for i in range(6)), (b"v",) * 6))
    outcome = s.apply(Call("list_keys"))
    assert isinstance(outcome, Failed) and "a reply of 6 values exceeds the limit of 5" in outcome.error


@pytest.fixture
def store() -> Iterator[tuple[CoordinatorThread, CoordinatorStore]]:
    secret = ch.new_secret()
    thread = CoordinatorThread(CoordinatorConfig(job_id=JOB, secret=secret, expected_workers=2)).start()
    try:
        client = CoordinatorStore(thread.address, secret, JOB, 30.0)
        try:
            yield thread, client
        finally:
            client.close()
    finally:
        thread.stop()


def test_a_thousand_gets_of_an_8_mib_key_are_refused_before_any_is_encoded(
    store: tuple[CoordinatorThread, CoordinatorStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = store
    big = bytes(range(256)) * (8 * MIB // 256)
    client.set("shared/big", big)
    encoded = 0

    def counting_encode(value: bytes) -> str:  # the coordinator's encoding of reply values, watched
        nonlocal encoded
        encoded += len(value)
        if encoded > 2 * ch.MAX_FRAME:  # already more than any frame could carry: a reply being built anyway
            raise MemoryError(f"the coordinator encoded {encoded} bytes of one reply")
        return service.encode_value.__wrapped__(value)  # type: ignore[attr-defined]

    counting_encode.__wrapped__ = service.encode_value  # type: ignore[attr-defined]
    monkeypatch.setattr(service, "encode_value", counting_encode)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        with pytest.raises(dist.DistStoreError) as raised:
            client.multi_get(["shared/big"] * 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = str(raised.value)
    assert "store multi_get: the reply would be" in error and f"over the frame limit of {ch.MAX_FRAME}" in error
    assert "\n" not in error
    assert encoded == 0  # refused before any value was encoded
    assert peak - before < 64 * MIB  # not the gigabytes of the reply
    # The store keeps serving, on the same connection.
    assert client.multi_get(["shared/big"]) == [big]
    client.set("shared/small", b"ok")
    assert client.get("shared/small") == b"ok" and client.num_keys() == 2
