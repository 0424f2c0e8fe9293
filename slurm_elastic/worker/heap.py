"""Give the heap's free pages back to the OS, at a commit, about once per interval (sharded jobs).

glibc keeps what a process frees: once large blocks have been freed its mmap threshold rises, later blocks
of that size come from the heap, and free pages between live blocks stay resident. A sharded (FSDP2) job,
run because memory is short, peaked 150-300 MB above plain FSDP2 at 22 M parameters in such pages alone
(docs/architecture.md, "Sharded state"). `malloc_trim(0)` hands them back; the next step faults in again
what it needs, which cost 7-9% of a 0.7 s step (3 M parameters) when done at every step, and still 7% at
most once per 2 s. So the default interval is 15 s (`SLURM_ELASTIC_HEAP_TRIM_S`): a trim every fourth step
of a 22 M-parameter model's 4 s step, which kept its peak at 1.12-1.15x plain FSDP2's, and rarely at a
small model, which keeps little. Without glibc (musl, macOS) there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

Trim = Callable[[int], object]


def glibc_trim() -> Trim | None:
    """glibc's `malloc_trim`, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def due(now: float, last: float, interval_s: float) -> bool:
    """Whether a trim is due: trimming is on (`interval_s` > 0) and the interval has passed since the last."""
    return interval_s > 0 and now - last >= interval_s


class HeapTrimmer:
    """Every rank says whether its interval has passed (`wanted`, in the step's control sum); if any has, all
    trim at that commit: one stall of the lockstep group, not one per rank at different steps."""

    def __init__(
        self, interval_s: float, trim: Trim | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._trim = trim if trim is not None else glibc_trim()
        self._clock = clock
        self._last = clock()
        self.trims = 0

    def wanted(self) -> bool:
        return self._trim is not None and due(self._clock(), self._last, self.interval_s)

    def trim(self) -> None:
        if self._trim is None or self.interval_s <= 0:
            return
        self._trim(0)
        self._last = self._clock()  # the interval counts from the trim's end: its own cost is not training
        self.trims += 1


__all__ = ["HeapTrimmer", "due", "glibc_trim"]
