"""A worker's exit waits, without the GIL, until no other thread of its process is runnable (bounded), so a
gloo thread still freeing a collective's tensors finishes before the interpreter finalizes."""

from __future__ import annotations

import threading
import time

from slurm_elastic.worker.process import settle_native_threads


def spin_for(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def spin_until(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_settling_waits_for_a_busy_thread_to_finish() -> None:
    busy = threading.Thread(target=spin_for, args=(0.3,))
    busy.start()
    assert settle_native_threads(limit_s=30)
    assert not busy.is_alive()  # it only settled once the busy thread had ended


def test_settling_gives_up_at_its_limit() -> None:
    stop = threading.Event()
    busy = threading.Thread(target=spin_until, args=(stop,))
    busy.start()
    try:
        assert not settle_native_threads(limit_s=0.2)
        assert busy.is_alive()
    finally:
        stop.set()
        busy.join()


def test_a_quiet_process_settles() -> None:
    idle = threading.Event()
    waiter = threading.Thread(target=idle.wait)  # a blocked thread is not runnable
    waiter.start()
    try:
        assert settle_native_threads(limit_s=30)
    finally:
        idle.set()
        waiter.join()
