"""Per-step and per-epoch hooks: `job.on_step(fn)` and `job.on_epoch(fn)`.

Hooks run on every rank, on the training thread, between steps (never inside one): `fn(step, loss)` after
each step this rank commits (`loss`: the step's mean loss over the whole global batch, the same on every
rank), and `fn(epoch)` once epoch `epoch` has ended (the rule in `decide/epochs.py`). A rank that takes a
newer state from its peers in a recovery runs the epoch hooks of the epochs it passed that way (not the
step hooks of those steps). A replica that starts or joins mid-run counts from where it starts.
Use `job.rank == 0` inside a hook for what only one rank should do (log, save).
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_elastic.decide.epochs import epoch_of

StepHook = Callable[[int, float], None]
EpochHook = Callable[[int], None]


class Callbacks:
    def __init__(self, num_samples: int) -> None:
        self._n = num_samples
        self._steps: list[StepHook] = []
        self._epochs: list[EpochHook] = []
        self._epoch: int | None = None  # the epoch this replica's hooks have reached (None: holds no state yet)

    def on_step(self, fn: StepHook) -> None:
        self._steps.append(fn)

    def on_epoch(self, fn: EpochHook) -> None:
        self._epochs.append(fn)

    def committed(self, step: int, loss: float, cursor: int) -> None:
        for hook in self._steps:
            hook(step, loss)
        self.settled(cursor)

    def settled(self, cursor: int) -> None:
        """The replica holds the state at `cursor` (committed, healed, loaded or first entered)."""
        now = epoch_of(cursor, self._n)
        before, self._epoch = self._epoch, now
        if before is None:
            return
        for epoch in range(before, now):
            for hook in self._epochs:
                hook(epoch)
