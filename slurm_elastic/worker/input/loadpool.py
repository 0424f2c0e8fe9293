"""Loader processes: `num_workers` forked processes that read and collate batches, as DataLoader's workers do.

The prefetcher hands each one a key (first stream position, number of samples); the process builds the
batch with the job's own `load` (the data set and `collate_fn` it inherited at fork) and sends it back
through torch's shared-memory pickling, as DataLoader does. Before each batch it seeds torch, `random` and
numpy from (seed, first position), so a random augmentation gives the same batch whichever process or
rank loads it. The processes are forked once, when the job is built (before any process group or
control thread exists), die with the thread that forked them, and are ended by `close()`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.multiprocessing  # registers the shared-memory reductions for tensors

from slurm_elastic.lineage import die_with_parent
from slurm_elastic.worker.rng import seed_torch

Key = tuple[int, int]
_child: dict[str, Any] = {}


def batch_seed(seed: int, start: int) -> int:
    """The RNG seed of the batch whose first stream position is `start`."""
    return (seed * 1_000_003 + start) % (2**31 - 1)


def _init_child(
    load: Callable[[int, int], Any],
    seed: int,
    worker_init: Callable[[int], None] | None,
    counter: Any,
    preexec: Callable[[], None] | None,
) -> None:
    if preexec is not None:
        preexec()  # die with the worker, never outlive it as an orphan
    # The worker's own SIGTERM handler (drain at the next boundary) came along with the fork: here it would
    # send a drain over the worker's connection and keep the process alive when close() ends it. SIGTERM was
    # blocked across the fork, so one sent before this point waits and then ends the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    with counter.get_lock():
        worker_id = counter.value
        counter.value += 1
    torch.set_num_threads(1)  # as DataLoader's workers: don't compete with the training thread
    _child.update(load=load, seed=seed)
    if worker_init is not None:
        worker_init(worker_id)


def _load_in_child(key: Key) -> Any:
    start, size = key
    s = batch_seed(_child["seed"], start)
    seed_torch(s)
    random.seed(s)
    np.random.seed(s)
    return _child["load"](start, size)


class LoadPool:
    def __init__(
        self,
        load: Callable[[int, int], Any],
        workers: int,
        *,
        seed: int = 0,
        worker_init: Callable[[int], None] | None = None,
    ) -> None:
        context = multiprocessing.get_context("fork")
        counter = context.Value("i", 0)
        self.workers = workers
        self._pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_child,
            initargs=(load, seed, worker_init, counter, die_with_parent()),
        )
        # Fork every process now, from this thread, before anything else runs; with SIGTERM held until each
        # process has dropped the handler it inherits (see _init_child).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self._pool.submit(int).result()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._processes = list(self._pool._processes.values())  # to end them in close()

    def submit(self, key: Key) -> Future[Any]:
        return self._pool.submit(_load_in_child, key)

    def close(self, timeout: float = 5.0) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in self._processes:
            with contextlib.suppress(Exception):
                proc.terminate()
        for proc in self._processes:
            with contextlib.suppress(Exception):
                proc.join(timeout)
                if proc.is_alive():  # a user's worker_init may have taken SIGTERM over
                    proc.kill()
                    proc.join(timeout)
