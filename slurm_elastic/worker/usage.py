"""How a training script may drive an ElasticJob, and the one-line error for each way it may not.

A job runs one training loop: `job.micro_batches(total_steps)`, `job.steps(total_steps)` or
`job.epochs(total_epochs)` with `job.micro_batches()` once inside each epoch. The loop runs to its end, or
is left at a step boundary by a `break` or a `return` that every rank takes at the same step (before the
first backward of a step, or after the last). Leaving it inside a step, or by an exception out of the loop
body, would leave a step half done on this rank while its peers wait for it: an error, reported to the
coordinator, and the worker exits non-zero. `LoopState` is the bookkeeping; it decides, the job acts.
"""

from __future__ import annotations

import dis
from dataclasses import dataclass
from types import FrameType
from typing import Literal

from slurm_elastic.errors import UsageError

LoopName = Literal["micro_batches", "steps", "epochs"]
Phase = Literal["idle", "running", "finished", "ended", "broken"]

EPOCH_HINT = "for an epoch loop write `for epoch in job.epochs(n):` with `for batch in job.micro_batches():` inside"


def left_by_statement(frame: FrameType | None) -> bool:
    """Whether the script's `frame` dropped the loop by a `break` or a `return` (CPython pops a for loop's
    iterator with POP_TOP there), rather than by an exception unwinding through it."""
    if frame is None:
        return False
    code, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(code) and dis.opname[code[at]] == "POP_TOP"


def left_early(loop: str, step: int) -> UsageError:
    return UsageError(
        f"the training loop job.{loop}() was left during step {step} (an exception out of the loop body, or a "
        "break between a step's first and last backward): leave it at a step boundary, the same step on every "
        "rank (before a step's first job.backward() or after its last), or call job.stop() to end it on every rank"
    )


def left_early_signature(loop: str) -> str:
    """The same for every rank and every step, so that repeated failures count as identical."""
    return f"UsageError: the training loop job.{loop}() was left early"


def backward_outside() -> UsageError:
    return UsageError(
        "job.backward() called outside a micro-batch: call it once per micro-batch, inside "
        "`for batch in job.micro_batches(...)` (or step.backward inside `for batch in step.micro_batches()`)"
    )


def save_during_step(step: int) -> UsageError:
    return UsageError(
        f"job.save() called during step {step}, after its first job.backward(): save between steps (before a "
        "step's first job.backward(), after the loop, after an epoch's micro-batches, or in an on_step / "
        "on_epoch hook)"
    )


@dataclass
class LoopState:
    phase: Phase = "idle"
    loop: LoopName | None = None
    finished_step: int = 0
    error: UsageError | None = None  # the misuse that broke the job (raised again on any later use)
    ending: str | None = None
    epoch: int | None = None  # the epoch job.epochs() yielded and has not moved past yet
    epoch_batches: bool = False  # job.micro_batches() was called in that epoch

    def usable(self) -> None:
        if self.error is not None:
            raise self.error

    def open(self, name: LoopName, step: int) -> None:
        """A training loop starts; raises unless it is the job's first."""
        self.usable()
        if self.phase == "running":
            raise UsageError(f"job.{name}() called while job.{self.loop}() is still running: a job runs one loop")
        if self.phase == "finished":
            raise UsageError(
                f"job.{name}() called after job.{self.loop}() finished the job at step {self.finished_step}: a job "
                "runs one loop, and total_steps counts the steps of the whole run (resumed ones included), not of "
                f"one epoch; {EPOCH_HINT}"
            )
        if self.phase == "ended":
            raise UsageError(f"job.{name}() called after this worker left the job ({self.ending})")
        self.phase, self.loop = "running", name

    def epoch_batches_start(self) -> int:
        """`job.micro_batches()` without total_steps: the epoch it iterates, or an error."""
        self.usable()
        if self.loop != "epochs" or self.phase != "running" or self.epoch is None:
            raise UsageError(f"job.micro_batches() without total_steps works only inside an epoch loop; {EPOCH_HINT}")
        if self.epoch_batches:
            raise UsageError(f"job.micro_batches() called twice in epoch {self.epoch}: call it once per epoch")
        self.epoch_batches = True
        return self.epoch

    def enter_epoch(self, epoch: int) -> None:
        self.epoch, self.epoch_batches = epoch, False

    def leave_epoch(self, epoch: int, ended: bool) -> None:
        """The body of job.epochs() for `epoch` returned; `ended`: the committed cursor passed its end."""
        self.usable()
        if not ended:
            raise UsageError(
                f"epoch {epoch} of job.epochs() ended without iterating job.micro_batches() to its end: "
                "iterate it once, to the end, in every epoch"
            )
        self.epoch = None

    def finish(self, step: int) -> None:
        self.phase, self.finished_step = "finished", step

    def end(self, kind: str) -> None:
        if self.phase != "broken":
            self.phase, self.ending = "ended", kind

    def broke(self, error: UsageError) -> None:
        self.phase, self.error = "broken", error
