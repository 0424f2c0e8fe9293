"""Which data set index each position of the global sample stream maps to.

The runtime keeps one stream of positions 0, 1, 2, ... across all epochs and commits a cursor with every
optimizer step. Position p belongs to epoch p // num_samples and is the (p % num_samples)-th entry of that
epoch's permutation, which is a pure function of (seed, epoch). So any rank, in any world size, after any
failure, computes the same indices from the committed cursor alone, and every sample is consumed exactly once.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_elastic.errors import DataError

__all__ = ["Cursor", "SampleOrder"]


def _non_negative_int(name: str, value: object, minimum: int = 0) -> int:
    """`value` as an int >= minimum; bools and floats are refused so that a unit mix-up fails loudly."""
    if isinstance(value, bool):
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


class SampleOrder:
    """The epoch-by-epoch order of a data set of `num_samples` samples, seeded by `seed`.

    Only the permutation of the most recently used epoch is cached, so memory stays at one permutation
    (8 bytes per sample) however long the run.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True) -> None:
        self._n = _non_negative_int("num_samples", num_samples, minimum=1)
        self._seed = _non_negative_int("seed", seed)
        self._shuffle = bool(shuffle)
        # One (epoch, permutation) pair, swapped as a whole so that concurrent readers never see a mix.
        self._cache: tuple[int, npt.NDArray[np.int64]] | None = None

    @property
    def num_samples(self) -> int:
        return self._n

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    def __repr__(self) -> str:
        return f"SampleOrder(num_samples={self._n}, seed={self._seed}, shuffle={self._shuffle})"

    def epoch_of(self, position: int) -> int:
        """The epoch that stream position `position` falls in."""
        return _non_negative_int("position", position) // self._n

    def permutation(self, epoch: int) -> npt.NDArray[np.int64]:
        """Epoch `epoch`'s order: a read-only permutation of range(num_samples)."""
        epoch = _non_negative_int("epoch", epoch)
        cache = self._cache
        if cache is not None and cache[0] == epoch:
            return cache[1]
        if self._shuffle:
            # SeedSequence + PCG64 is specified bit for bit by numpy, so every rank and platform agrees.
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self._seed, epoch])))
            perm = rng.permutation(self._n).astype(np.int64, copy=False)
        else:
            perm = np.arange(self._n, dtype=np.int64)
        perm.flags.writeable = False  # callers share the cache; a stray write would corrupt the order
        self._cache = (epoch, perm)
        return perm

    def indices(self, start: int, count: int) -> npt.NDArray[np.int64]:
        """Data set indices for stream positions start .. start + count - 1, crossing epochs as needed."""
        start = _non_negative_int("start", start)
        count = _non_negative_int("count", count)
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self._n)
            take = min(self._n - offset, count - done)
            out[done : done + take] = self.permutation(epoch)[offset : offset + take]
            done += take
        return out


@dataclass(frozen=True)
class Cursor:
    """The committed position in the global sample stream: the next position a step will consume."""

    position: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "position", _non_negative_int("cursor position", self.position))

    def epoch(self, num_samples: int) -> int:
        """The epoch the next sample belongs to."""
        return self.position // _non_negative_int("num_samples", num_samples, minimum=1)

    def advance(self, count: int) -> Cursor:
        """The cursor after a committed step that consumed `count` samples."""
        return Cursor(self.position + _non_negative_int("count", count))

    def to_json(self) -> dict[str, int]:
        return {"position": self.position}

    @classmethod
    def from_json(cls, data: Any) -> Cursor:
        """Parse what `to_json` wrote; anything else is a DataError naming what was found."""
        if not isinstance(data, dict) or set(data) != {"position"}:
            raise DataError(f"cursor must be a dict with exactly the key 'position', got {data!r}")
        return cls(data["position"])
