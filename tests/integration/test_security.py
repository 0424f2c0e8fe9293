"""A job under attack still trains to the reference result: ranks as threads around a real coordinator
(slurm_elastic.testing.threadranks), a rank that dies so a second generation forms through the store, and an attacker
without the secret on the same host the whole time: idle connections by the thousand, oversized and
malformed frames before authentication, hellos with forged or non-hex proofs for every role, raw store
calls, torch's TCPStore protocol. The attacker gets nothing; the survivors end with the same bits as the
job trained in one process (exact mode)."""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slurm_elastic.coordinator.refusals import refused_by_category
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.testing.threadranks import GroupFault, ThreadJob
from slurm_elastic.worker import ElasticJob
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports

pytestmark = pytest.mark.timeout(180)

STEPS = 8
GLOBAL_BATCH, MICRO_BATCH = 12, 2
G = torch.Generator().manual_seed(11)
DATA = [(torch.randn(6, generator=G), torch.randn(2, generator=G)) for _ in range(96)]


def model() -> nn.Module:
    g = torch.Generator().manual_seed(5)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return net


def train(env: WorkerEnv, ports: Ports, gate: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    job = ElasticJob(net, opt, dataset=DATA, global_batch=GLOBAL_BATCH, micro_batch=MICRO_BATCH, env=env, ports=ports)
    for step in job.steps(STEPS):
        if gate is not None:
            gate(step.number)
        for x, y in step.micro_batches():
            step.backward(nn.functional.mse_loss(net(x), y))
    return [p.detach().clone() for p in net.parameters()]


REFERENCE = train(worker_env({"SLURM_ELASTIC_REDUCE_DTYPE": "float64"}), Ports(process_hooks=False))


def listening_ports() -> set[int]:
    """TCP ports this process listens on (the coordinator runs in it), as an attacker would list them."""
    import os
    from pathlib import Path

    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in mine:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def frame(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


class Attacker:
    """Everything a user of the same host can try without the job's secret, over and over."""

    def __init__(self, address: str, job_id: str, ports: set[int]) -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.ports = sorted(ports)  # every port the job listens on
        self.job_id = job_id
        self.stop = threading.Event()
        self.idle: list[socket.socket] = []
        self.leaked: list[bytes] = []  # anything beyond a challenge or a refusal
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, name="attacker", daemon=True)

    def __enter__(self) -> Attacker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        for sock in self.idle:
            sock.close()

    def _connect(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=2)

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                for _ in range(200):
                    if len(self.idle) < 3000:
                        self.idle.append(self._connect())
            for attempt in (self._oversized, self._forged_hello, self._raw_store_call, self._tcpstore):
                with contextlib.suppress(OSError, RuntimeError):
                    attempt()
            self.rounds += 1

    def _read_all(self, sock: socket.socket) -> bytes:
        data = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                data += chunk
        return data

    def _expect_nothing(self, sock: socket.socket, data: bytes) -> None:
        # Only the challenge (and a refusal) may come back; nothing of the job.
        for kind in (b'"type":"challenge"', b'"type":"refused"'):
            data = data.replace(kind, b"")
        if b'"type"' in data:
            self.leaked.append(data)

    def _oversized(self) -> None:
        with self._connect() as sock:
            sock.sendall(struct.pack(">I", 50 * 1024 * 1024) + b"x" * 4096)
            self._expect_nothing(sock, self._read_all(sock))

    def _forged_hello(self) -> None:
        for role, proof in (("store", "0" * 64), ("worker", "z" * 64), ("client", "é" * 64), ("agent", "f" * 64)):
            with self._connect() as sock:
                hello = {"type": "hello", "role": role, "job_id": self.job_id, "nonce": "ab" * 16, "proof": proof}
                sock.sendall(frame(hello) + frame({"type": "store", "id": 1, "op": "list_keys"}))
                self._expect_nothing(sock, self._read_all(sock))

    def _raw_store_call(self) -> None:
        with self._connect() as sock:
            sock.sendall(frame({"type": "store", "id": 1, "op": "set", "keys": ["rdzv/g1/0/0"], "values": ["eA=="]}))
            sock.sendall(frame({"type": "status"}))
            self._expect_nothing(sock, self._read_all(sock))

    def _tcpstore(self) -> None:
        for port in self.ports:
            with contextlib.suppress(RuntimeError):
                client = dist.TCPStore(
                    self.host, port, is_master=False, timeout=datetime.timedelta(seconds=1), wait_for_workers=False
                )
                client.set("probe", "attacker")
                self.leaked.append(client.get("probe"))


def test_a_job_under_attack_trains_to_the_reference_result() -> None:
    gate_open = threading.Event()

    def gate(step: int) -> None:
        if step == 2:
            gate_open.wait(30)  # let the attack run a while before the rank dies and g2 forms

    before = listening_ports()
    job = ThreadJob(lambda env, ports: train(env, ports, gate), nodes=3, faults=[GroupFault("t3:0:0", 1, 6, "die")])
    coordinator = job.coordinator.coordinator
    with Attacker(job.coordinator.address, "threads", listening_ports() - before) as attacker:
        try:
            job.start()
            deadline = time.monotonic() + 30
            while attacker.rounds < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            gate_open.set()
            results = job.join(150)
        finally:
            gate_open.set()
            job.stop()
        assert attacker.rounds >= 3
    assert attacker.leaked == []
    assert results["t3:0:0"].died
    survivors = [r for r in results.values() if r.value is not None]
    assert [r.error for r in results.values() if r.error is not None] == []
    assert len(survivors) == 2
    for r in survivors:
        got = {str(i): t for i, t in enumerate(r.value)}
        assert max_param_rel_diff(got, {str(i): t for i, t in enumerate(REFERENCE)}) <= tolerance("float64", STEPS)
    # A second generation formed; the store holds its keys only, none of the attacker's.
    assert coordinator.state.generation is not None and coordinator.state.generation.number >= 2
    assert coordinator.store.state.namespaces() == [coordinator.state.generation.number]
    coordinator.report_refusals()  # the coordinator has stopped: the last interval's refusals
    refusals = refused_by_category(coordinator.events.all())
    assert refusals["oversized frame"] > 0 and refusals["bad proof"] > 0 and refusals["malformed hello"] > 0
    assert coordinator.connections.gate.evicted > 0
