"""The batch prefetcher: reads ahead on its own thread, serves out-of-schedule requests, re-plans, reports errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_elastic.waiting import wait_until
from slurm_elastic.worker.input.prefetch import Key, Prefetcher


class Source:
    """A loader that records which thread loaded which key; `gate` can hold it back."""

    def __init__(self) -> None:
        self.loaded: list[Key] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_at: int | None = None

    def __call__(self, start: int, size: int) -> tuple[int, int]:
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        if start == self.fail_at:
            raise KeyError(f"sample {start} is broken")
        self.loaded.append((start, size))
        return (start, size)


def schedule(first: int, size: int = 4) -> Iterator[Key]:
    start = first
    while True:
        yield (start, size)
        start += size


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    wait_until(predicate, timeout=timeout, what="the prefetcher", poll=0.005)


def test_reads_ahead_up_to_its_depth_on_its_own_thread() -> None:
    src = Source()
    pf = Prefetcher(src, depth=3)
    pf.plan(schedule(0))
    wait_for(lambda: len(src.loaded) == 3)
    time.sleep(0.05)
    assert src.loaded == [(0, 4), (4, 4), (8, 4)], "no more than `depth` ahead"
    assert pf.get(0, 4) == (0, 4)
    wait_for(lambda: len(src.loaded) == 4)
    assert src.loaded[-1] == (12, 4)
    assert src.threads == {"se-prefetch"}, "only the loader thread touches the data set"
    pf.close()


def test_a_request_outside_the_schedule_is_served_first() -> None:
    src = Source()
    pf = Prefetcher(src, depth=2)
    pf.plan(schedule(100))
    assert pf.get(40, 2) == (40, 2)
    assert src.threads == {"se-prefetch"}
    pf.close()


def test_each_batch_is_loaded_once_when_the_training_thread_is_faster() -> None:
    src = Source()
    pf = Prefetcher(src, depth=2)
    pf.plan(schedule(0))
    for start in range(0, 40, 4):
        assert pf.get(start, 4) == (start, 4)
    assert src.loaded[:10] == [(s, 4) for s in range(0, 40, 4)]
    pf.close()


def test_replanning_drops_what_was_read_for_the_old_plan() -> None:
    src = Source()
    pf = Prefetcher(src, depth=2)
    pf.plan(schedule(0))
    wait_for(lambda: len(src.loaded) == 2)
    pf.plan(schedule(0, size=2))  # a new world size: other micro-batches from the same cursor
    assert pf.get(0, 2) == (0, 2)
    assert pf.get(2, 2) == (2, 2)
    pf.close()


def test_a_failing_data_set_raises_its_own_error_on_the_training_thread() -> None:
    src = Source()
    src.fail_at = 4
    pf = Prefetcher(src, depth=2)
    pf.plan(schedule(0))
    assert pf.get(0, 4) == (0, 4)
    with pytest.raises(KeyError, match="sample 4 is broken"):
        pf.get(4, 4)
    pf.close()


def test_depth_zero_loads_on_the_calling_thread() -> None:
    src = Source()
    pf = Prefetcher(src, depth=0)
    pf.plan(schedule(0))
    assert pf.get(8, 4) == (8, 4)
    assert src.threads == {threading.current_thread().name}


def test_a_closed_prefetcher_refuses_to_wait_forever() -> None:
    src = Source()
    src.gate.clear()
    pf = Prefetcher(src, depth=1)
    pf.close()
    src.gate.set()
    with pytest.raises(RuntimeError, match="stopped"):
        pf.get(0, 4)


def _load_pid_and_draw(start: int, size: int) -> tuple[int, int, float]:
    import os

    import torch

    return start, os.getpid(), float(torch.rand(()))


def test_loader_processes_load_ahead_and_seed_each_batch_from_its_position() -> None:
    import os

    from slurm_elastic.lineage import children
    from slurm_elastic.worker.input.loadpool import LoadPool

    pf = Prefetcher(_load_pid_and_draw, depth=4, pool=LoadPool(_load_pid_and_draw, 2, seed=5))
    try:
        pf.plan(schedule(0))
        got = [pf.get(start, 4) for start in (0, 4, 8, 12)]
        assert [g[0] for g in got] == [0, 4, 8, 12]
        assert all(g[1] != os.getpid() for g in got), "loaded in the loader processes"
        pf.plan(schedule(4))  # re-planned (a recovery): the same batch again, with the same random draw
        assert pf.get(4, 4)[2] == got[1][2]
    finally:
        pf.close()
    assert not children(), "close() ends the loader processes"


def test_loader_processes_end_at_close_without_running_the_workers_sigterm_handler(tmp_path: Path) -> None:
    """A worker drains on SIGTERM (its handler sends a drain request). Its loader processes are forked with
    that handler: close() must end them, not have them ask for a drain and live on."""
    import os
    import signal

    from slurm_elastic.lineage import children
    from slurm_elastic.worker.input.loadpool import LoadPool

    ran = tmp_path / "handler-ran"

    def drain_instead(signum: int, frame: object) -> None:
        ran.write_text(str(os.getpid()))

    previous = signal.signal(signal.SIGTERM, drain_instead)
    try:
        pool = LoadPool(_load_pid_and_draw, 2)
        assert pool.submit((0, 4)).result()[1] != os.getpid()
        pool.close(timeout=5.0)
        # Closed at once: SIGTERM can reach a process before it has dropped the inherited handler (1 in ~150
        # processes did, in CI and here, before SIGTERM was held across the fork).
        for _ in range(25):
            LoadPool(_load_pid_and_draw, 4).close(timeout=5.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not ran.exists(), "a loader process ran the worker's SIGTERM handler"
    assert not children(), "close() ends the loader processes"
