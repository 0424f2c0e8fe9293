"""Micro-batches read and collated ahead, on a thread of their own, so the training thread only computes.

The worker knows which stream positions its next micro-batches cover (its rank's share of each coming
step), so it hands the loader a schedule; the loader keeps up to `depth` batches ready. Only the loader
thread touches the data set (one that is not thread-safe stays safe), and a request for a batch that is
not next in the schedule (the same step re-run after a recovery, say) is served first. A new generation
re-plans the schedule. What the step really used is still what the ledger records.

With a `LoadPool` (`num_workers` > 0) the loader thread only hands keys to the pool's processes, up to
`depth` batches in flight or ready, and files each batch as it lands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from slurm_elastic.worker.input.loadpool import LoadPool

Key = tuple[int, int]  # (first stream position, number of samples)


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    def __init__(
        self, load: Callable[[int, int], Any], depth: int, *, pin_memory: bool = False, pool: LoadPool | None = None
    ) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._load = load
        self.depth = depth
        self._pin = pin_memory
        self._pool = pool
        self._cond = threading.Condition()
        self._schedule: Iterator[Key] = iter(())
        self._ready: dict[Key, Any] = {}
        self._inflight: dict[Key, int] = {}  # keys a pool process is loading, and the plan version they serve
        self._waiting: Key | None = None  # the batch the training thread waits for
        self._last_start = -1  # the training thread has taken the batches up to here
        self._version = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name="se-prefetch", daemon=True)
            self._thread.start()

    def plan(self, schedule: Iterator[Key]) -> None:
        """Replace what to load next (the batches already loaded are dropped)."""
        with self._cond:
            self._version += 1
            self._schedule = schedule
            self._ready.clear()
            self._inflight.clear()  # what lands for an older plan is dropped
            self._last_start = -1
            self._cond.notify_all()

    def get(self, start: int, size: int) -> Any:
        key = (start, size)
        if self._thread is None:
            return self._prepare(key)
        with self._cond:
            for stale in [k for k in self._ready if k[0] < start]:
                del self._ready[stale]  # passed over (a step re-planned after a recovery)
            self._waiting = key
            self._cond.notify_all()
            try:
                while key not in self._ready:
                    if self._closed or not self._thread.is_alive():
                        raise RuntimeError("the batch prefetch thread has stopped")
                    self._cond.wait(1.0)
            finally:
                self._waiting = None
            item = self._ready.pop(key)
            self._last_start = start
            self._cond.notify_all()
        if isinstance(item, _Failed):
            raise item.error
        return item

    def close(self, timeout: float = 10.0) -> None:
        """Stop reading ahead and wait for a batch being read: no thread may run the user's data code (or
        torch) while the interpreter shuts down."""
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._pool is not None:
            self._pool.close()

    def _prepare(self, key: Key) -> Any:
        batch = self._pool.submit(key).result() if self._pool is not None else self._load(*key)
        return self._pinned(batch)

    def _pinned(self, batch: Any) -> Any:
        if self._pin:
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch)
        return batch

    def _next_key(self) -> Key | None:
        """Under the lock: what to load now, or None to wait."""
        busy = self._ready.keys() | self._inflight.keys()
        if self._waiting is not None and self._waiting not in busy:
            return self._waiting
        if len(busy) >= self.depth:
            return None
        for key in self._schedule:
            if key not in busy and key[0] > self._last_start:
                return key
        return None

    def _landed(self, key: Key, version: int, future: Future[Any]) -> None:
        """A pool process finished `key` (called on the pool's thread)."""
        try:
            item: Any = self._pinned(future.result())
        except BaseException as exc:  # the user's data set or collate_fn failed, or a loader process died
            item = _Failed(exc)
        with self._cond:
            if self._inflight.get(key) == version:
                del self._inflight[key]
            if version == self._version or key == self._waiting:
                self._ready[key] = item
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                key = self._next_key()
                while key is None and not self._closed:
                    self._cond.wait()
                    key = self._next_key()
                if self._closed:
                    return
                version = self._version
                if self._pool is not None:
                    self._inflight[key] = version  # type: ignore[index]
            if self._pool is not None:
                try:
                    future = self._pool.submit(key)  # type: ignore[arg-type]
                except RuntimeError:  # the pool was shut down meanwhile (close)
                    return
                future.add_done_callback(lambda f, k=key, v=version: self._landed(k, v, f))  # type: ignore[misc]
                continue
            try:
                item: Any = self._prepare(key)  # type: ignore[arg-type]
            except BaseException as exc:  # the user's data set or collate_fn failed: raised on the training thread
                item = _Failed(exc)
            with self._cond:
                if version == self._version or key == self._waiting:
                    self._ready[key] = item  # type: ignore[index]
                self._cond.notify_all()
