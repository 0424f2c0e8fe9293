"""Where a training loop ends, and which epochs a step ends: pure arithmetic on the committed cursor.

The global sample stream is one sequence of positions across epochs (`data/order.py`): position p belongs
to epoch p // num_samples. A step consumes `step_samples` consecutive positions, so a step may straddle
an epoch boundary. The rule: **epoch e ends with the first step whose committed cursor reaches
(e + 1) * num_samples**; that step's last samples are the first ones of epoch e + 1's order (nothing is
dropped or repeated). `job.epoch` is `cursor // num_samples`, so every rank, a resumed job and a resized
one agree on it, because they agree on the committed cursor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurm_elastic.errors import ConfigError


def epoch_of(cursor: int, num_samples: int) -> int:
    """The epoch the next sample belongs to (the job's current epoch)."""
    return cursor // num_samples


def epochs_ended(before: int, after: int, num_samples: int) -> range:
    """The epochs that end when the cursor moves from `before` to `after` (several if a step is longer
    than an epoch; none if it stays inside one)."""
    return range(before // num_samples, after // num_samples)


def epoch_end(epoch: int, num_samples: int) -> int:
    """The cursor at which epoch `epoch` has ended."""
    return (epoch + 1) * num_samples


@dataclass(frozen=True)
class Goal:
    """Where a loop ends: once `steps` optimizer steps are committed, or once the committed cursor
    reaches `samples` (the end of an epoch). Exactly one is given."""

    steps: int | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.samples is None):
            raise ConfigError(f"a goal needs exactly one of steps and samples, got {self.steps!r}, {self.samples!r}")

    def reached(self, step: int, cursor: int) -> bool:
        if self.steps is not None:
            return step >= self.steps
        assert self.samples is not None
        return cursor >= self.samples

    def steps_left(self, step: int, cursor: int, step_samples: int) -> int:
        """How many more steps of `step_samples` samples reach the goal (bounds the batches read ahead)."""
        if self.steps is not None:
            return max(0, self.steps - step)
        assert self.samples is not None
        return max(0, math.ceil((self.samples - cursor) / step_samples))

    def describe(self) -> str:
        return f"{self.steps} steps" if self.steps is not None else f"cursor {self.samples}"


def positive_int(name: str, value: object) -> int:
    """`value` as an int >= 1, or a one-line ConfigError naming it (bools refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"invalid {name} {value!r}: expected an integer >= 1")
    return value
