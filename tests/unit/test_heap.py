"""worker/heap.py: a sharded job hands glibc's free heap pages back at a commit, at most once per interval."""

from __future__ import annotations

import ctypes
import itertools
import platform

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker import ElasticJob, heap
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.heap import HeapTrimmer, due, glibc_trim
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.sharded.mesh import placeholder_mesh


@pytest.mark.parametrize(
    ("now", "last", "interval", "expected"),
    [
        (10.0, 0.0, 0, False),  # off
        (10.0, 0.0, 2, True),
        (1.9, 0.0, 2, False),
        (2.0, 0.0, 2, True),
        (5.0, 4.0, 2, False),
        (6.5, 4.0, 2, True),
    ],
)
def test_due(now: float, last: float, interval: float, expected: bool) -> None:
    assert due(now, last, interval) is expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_wanted_once_the_interval_has_passed_counting_from_the_end_of_the_last_trim() -> None:
    clock, calls = FakeClock(), []
    trimmer = HeapTrimmer(2, trim=calls.append, clock=clock)
    trimmed_at = []
    for now in (0.5, 1.0, 2.0, 2.5, 3.9, 4.0, 9.0):
        clock.now = now
        if trimmer.wanted():
            trimmer.trim()
            trimmed_at.append(now)
    assert trimmed_at == [2.0, 4.0, 9.0] and trimmer.trims == 3
    assert calls == [0, 0, 0]  # malloc_trim(0): no padding kept at the top of the heap


def test_an_interval_of_zero_neither_wants_nor_trims_even_when_peers_agreed_to() -> None:
    clock, calls = FakeClock(), []
    trimmer = HeapTrimmer(0, trim=calls.append, clock=clock)
    for now in range(100):
        clock.now = float(now)
        assert not trimmer.wanted()
        trimmer.trim()  # another rank wanted it: this rank's setting still holds
    assert calls == [] and trimmer.trims == 0


def test_without_malloc_trim_nothing_is_wanted_or_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "glibc_trim", lambda: None)
    clock = FakeClock()
    trimmer = HeapTrimmer(1, clock=clock)
    clock.now = 5.0
    assert not trimmer.wanted()
    trimmer.trim()
    assert trimmer.trims == 0


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_malloc_trim_gives_free_pages_between_live_blocks_back() -> None:
    trim = glibc_trim()
    assert trim is not None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 1024  # below glibc's mmap threshold: from the heap, 64 MB in all
    blocks = [libc.malloc(size) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, size)  # resident
    kept = blocks[9::10]  # every tenth stays live, so the free ones are not at the heap's top
    for i, b in enumerate(blocks):
        if i % 10 != 9:
            libc.free(b)
    try:
        before = _resident_bytes()
        trim(0)
        after = _resident_bytes()
    finally:
        for b in kept:
            libc.free(b)
    freed = size * (count - len(kept))
    assert before - after > freed // 2, f"resident {before >> 20} MB -> {after >> 20} MB after freeing {freed >> 20} MB"


def test_the_interval_comes_from_the_environment() -> None:
    assert worker_env({}).heap_trim_s == 15
    assert worker_env({"SLURM_ELASTIC_HEAP_TRIM_S": "0"}).heap_trim_s == 0
    assert worker_env({"SLURM_ELASTIC_HEAP_TRIM_S": "30"}).heap_trim_s == 30
    with pytest.raises(ConfigError, match="SLURM_ELASTIC_HEAP_TRIM_S"):
        worker_env({"SLURM_ELASTIC_HEAP_TRIM_S": "-1"})


def test_a_sharded_job_trims_after_its_commits() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    mesh = placeholder_mesh()
    fully_shard(net[0], mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    data = [(torch.randn(4), torch.randn(1)) for _ in range(32)]
    env, ports = worker_env({}), Ports(process_hooks=False)
    job = ElasticJob(net, opt, dataset=data, global_batch=4, micro_batch=2, env=env, ports=ports)
    assert job._sharded is not None and job._sharded.heap.interval_s == 15
    ticks, calls = itertools.count(), []
    job._sharded.heap = HeapTrimmer(2, trim=calls.append, clock=lambda: float(next(ticks)))
    committed = 0
    for step in job.steps(6):
        for x, y in step.micro_batches():
            step.backward(nn.functional.mse_loss(net(x), y))
        committed += 1
    # The clock ticks once when a step asks whether a trim is wanted and once after a trim: wanted at 2, 5, 8.
    assert committed == 6 and calls == [0, 0, 0]
