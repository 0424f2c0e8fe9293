"""Control messages and frames: every message type round-trips; malformed, unknown and oversized frames fail."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import struct
import typing

import pytest
from pydantic import BaseModel, ValidationError

from slurm_elastic.errors import ProtocolError
from slurm_elastic.wire import channel as ch
from slurm_elastic.wire import messages as msg

# A socket or transport left open fails the test instead of warning.
pytestmark = [
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]

SETTINGS = msg.WorkerSettings(
    heartbeat_interval_s=0.5,
    pg_timeout_s=30.0,
    backend="gloo",
    store_prefix="p",
)

SAMPLES: list[BaseModel] = [
    msg.Challenge(job_id="job-1", nonce="ab" * 16),
    msg.Hello(role="worker", job_id="job-1", nonce="cd" * 16, proof="f" * 64),
    msg.Welcome(proof="e" * 64),
    msg.Refused(reason="bad job secret"),
    msg.Register(worker_id="n1:0:0", node="n1", local_rank=0, pid=123, committed_step=-1),
    msg.Heartbeat(generation=0, step=-1, phase="init"),
    msg.Committed(generation=2, step=7, loss=1.25, samples=64, world=3, time=12.5),
    msg.AtBoundary(generation=3, step=9),
    msg.Relayed(worker="n1:0:0", frame='{"type":"at_boundary","generation":3,"step":9}'),
    msg.Beats(beats=[("n1:0:0", 3, 9, "compute")]),
    msg.RelayClosed(worker="n1:0:0"),
    msg.Roster(generation=2, ranks=["n1:0:0", "n2:0:0"]),
    msg.Assigns(generation=2, members=[("n1:0:0", 0)], boundary_step=None, cause="start"),
    msg.Assigns(generation=3, members=[("n1:0:0", 0)], since=2, left=["n2:0:0"], boundary_step=9, cause="drain"),
    msg.WorkerEvent(kind="recovery", fields={"seconds": 0.13, "peers": [1, 2], "note": "ünïcode"}),
    msg.Failure(worker_id="n1:0:0", signature="ValueError: x", traceback="Traceback ...\n"),
    msg.CollectiveFault(generation=1, step=0, detail="gloo: connection reset"),
    msg.StateLost(generation=3, step=7, detail="rows 2-4 of tensor 0 have no live holder"),
    msg.Finished(generation=4, step=100),
    msg.Finished(generation=4, step=12, how="job.steps() left at step 12"),
    msg.StopAsked(reason="time budget spent"),
    msg.LoopOpened(settings={"total_steps": 20, "seed": 0, "shuffle": True, "micro_batch": None, "lr": 0.5}),
    msg.Registered(settings=SETTINGS),
    msg.Assign(generation=2, rank=1, ranks=["a", "b"], boundary_step=None, cause="crash"),
    msg.Assign(generation=3, rank=0, ranks=["a"], boundary_step=12, cause="drain"),
    msg.ChangePending(generation=5),
    msg.Pulse(generation=5),
    msg.Leave(reason="drained"),
    msg.Stop(reason="failed", error="all members lost"),
    msg.Stop(reason="complete"),
    msg.RegisterNode(node="n[1-2]", host="h", nproc=4, pid=9, slurm_job_id="42"),
    msg.WorkerExited(worker_id="n1:0:0", returncode=-9, will_restart=True),
    msg.KillWorker(worker_id="n1:0:0", reason="hang"),
    msg.RestartWorkers(reason="restart mode"),
    msg.HoldNode(hold_s=600.0),
    msg.Probe(round=3, targets={"n2": "10.78.0.12:41000", "n3": "10.78.0.13:41000"}, timeout_s=3.0),
    msg.ProbeResult(round=3, unreachable=["n3"]),
    msg.DrainRequest(nodes=["n3"], mode="now", reason="preempted", source="epilog"),
    msg.DrainRequest(nodes=["n3", "n4"], reason="reclaimed", source="reclaim", hold_s=120.0),
    msg.KeepPending(count=2, partition="spot"),
    msg.KeepPending(count=0),
    msg.StatusRequest(),
    msg.StoreRequest(id=7, op="compare_set", keys=["rdzv/g1/k"], values=["", "YQ=="], timeout_ms=0),
    msg.StoreReply(id=7, values=["YQ=="], number=1),
    msg.StoreReply(id=8, ok=False, error="store get: timed out after 1 s waiting for 'rdzv/g1/0'"),
    msg.Ack(ok=False, detail="no such node"),
    msg.StatusReply(
        job_id="job-1",
        state="running",
        generation=2,
        world_size=1,
        step=5,
        loss=None,
        samples_per_s=10.5,
        nodes=["n1"],
        node_jobs={"n1": "42", "n2": None},
        members=[msg.MemberStatus(worker_id="a", node="n1", rank=0, step=5, phase="compute", last_seen_s=0.2)],
        pending=[],
        draining=["n2"],
        events=[{"event": "membership_change", "generation": 2}],
    ),
]


def union_members() -> set[type]:
    (union, *_) = typing.get_args(msg.Message)
    return set(typing.get_args(union))


def test_samples_cover_every_message_type() -> None:
    assert {type(s) for s in SAMPLES} == union_members()


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: f"{type(s).__name__}")
def test_frame_round_trip(sample: BaseModel) -> None:
    frame = ch.encode_frame(sample)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    body = frame[4:]
    json.loads(body)  # plain JSON on the wire, never pickle
    decoded = ch.decode_body(body)
    assert type(decoded) is type(sample) and decoded == sample
    assert msg.parse_message(msg.dump_message(sample)) == sample


def test_a_commit_whose_loss_overflowed_arrives_as_it_was_sent() -> None:
    # A float16 step skipped for an inf gradient commits an inf (or NaN) loss: the commit must not be dropped.
    for loss in (float("inf"), float("-inf")):
        sent = msg.Committed(generation=1, step=2, loss=loss, samples=12, world=3, time=1.0)
        assert ch.decode_body(ch.encode_frame(sent)[4:]) == sent
    nan = msg.Committed(generation=1, step=2, loss=float("nan"), samples=12, world=3, time=1.0)
    decoded = ch.decode_body(ch.encode_frame(nan)[4:])
    assert isinstance(decoded, msg.Committed) and math.isnan(decoded.loss)


def test_invalid_json_is_a_protocol_error() -> None:
    for body in (b"{not json", b"", b"\xff\xfe", b"[1, 2]", b"null"):
        with pytest.raises(ProtocolError, match="invalid control message"):
            ch.decode_body(body)


@pytest.mark.parametrize(
    "body",
    [
        {"type": "bogus"},
        {"no_type": 1},
        {"type": "welcome", "extra": 1},
        {"type": "assign", "generation": 0, "rank": 0, "ranks": ["a"], "boundary_step": None, "cause": "x"},
        {"type": "register", "worker_id": "", "node": "n1", "local_rank": 0, "pid": 1, "committed_step": -1},
        {"type": "register", "worker_id": "w", "node": "n1; rm -rf /", "local_rank": 0, "pid": 1, "committed_step": 0},
        {"type": "hello", "role": "admin", "job_id": "j", "nonce": "a" * 32, "proof": "f" * 64},
        {"type": "hello", "role": "worker", "job_id": "j", "nonce": "a" * 32, "proof": "z" * 64},  # not hex
        {"type": "hello", "role": "worker", "job_id": "j", "nonce": "a" * 32, "proof": "F" * 64},  # not lower case
        {"type": "hello", "role": "worker", "job_id": "j", "nonce": "a" * 32, "proof": "é" * 64},
        {"type": "hello", "role": "worker", "job_id": "j", "nonce": "a" * 32, "proof": "f" * 63},
        {"type": "hello", "role": "worker", "job_id": "j", "nonce": "a" * 31, "proof": "f" * 64},
        {"type": "hello", "role": "worker", "job_id": "j", "proof": "f" * 64},  # no nonce: no mutual proof
        {"type": "welcome"},  # a server that proves nothing
        {"type": "challenge", "job_id": "j", "nonce": "x" * 32},
        {"type": "store", "id": 1, "op": "drop_table", "keys": ["k"]},
        {"type": "store", "id": 1, "op": "get", "keys": ["k" * 513]},
        {"type": "store", "id": 1, "op": "multi_get", "keys": ["k"] * 1025},
        {"type": "store", "id": -1, "op": "num_keys"},
        {"type": "drain", "nodes": []},
        {"type": "drain", "nodes": ["n3"], "hold_s": -1},
        {"type": "hold_node", "hold_s": 0},  # a hold that ends at once is no hold
        {"type": "hold_node", "hold_s": 86400},
        {"type": "keep_pending", "count": 1001},
        {"type": "keep_pending", "count": 1, "partition": "a b"},
    ],
)
def test_unknown_or_invalid_messages_are_rejected(body: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="invalid control message"):
        ch.decode_body(json.dumps(body).encode())
    with pytest.raises(ValidationError):
        msg.parse_message(json.dumps(body).encode())


def test_oversized_message_is_refused_before_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "MAX_FRAME", 64)
    ch.encode_frame(msg.Leave(reason="x"))
    with pytest.raises(ProtocolError, match=r"message Leave is \d+ bytes; the limit is 64"):
        ch.encode_frame(msg.Leave(reason="x" * 100))


def test_oversized_frame_header_is_refused_by_a_channel() -> None:
    a, b = socket.socketpair()
    receiver = ch.Channel(b)
    try:
        a.sendall(struct.pack(">I", ch.MAX_FRAME + 1))
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            receiver.recv(timeout=5)
    finally:
        a.close()
        receiver.close()


def test_oversized_frame_header_is_refused_by_the_server_side() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", ch.MAX_FRAME + 1))
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            await ch.read_message(reader)
        good = asyncio.StreamReader()
        welcome = msg.Welcome(proof="0" * 64)
        good.feed_data(ch.encode_frame(welcome) + struct.pack(">I", 5) + b"nope!")
        assert await ch.read_message(good) == welcome
        with pytest.raises(ProtocolError, match="invalid control message"):
            await ch.read_message(good)

    asyncio.run(main())


def test_channel_round_trip_and_peer_close() -> None:
    a, b = socket.socketpair()
    left, right = ch.Channel(a), ch.Channel(b)
    try:
        for sample in SAMPLES:
            left.send(sample)
        assert [right.recv(timeout=5) for _ in SAMPLES] == SAMPLES
        b.sendall(b"\x00\x00\x00\x10{")  # a truncated frame, then the peer goes away
        right.close()
        with pytest.raises(ConnectionError, match="closed by peer"):
            left.recv(timeout=5)
    finally:
        left.close()
        right.close()


def test_channel_recv_times_out() -> None:
    a, b = socket.socketpair()
    left, right = ch.Channel(a), ch.Channel(b)
    try:
        with pytest.raises(TimeoutError):
            left.recv(timeout=0.01)
    finally:
        left.close()
        right.close()
