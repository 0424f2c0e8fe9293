"""One step of an ElasticJob, whatever its strategy: what a `Step` asks of the job (batches, phases, backward),
and how an attempt is started, concluded and committed (the ledger, the commit event, the checkpoints).
`ElasticJob` (job.py) holds one and adds the loops, the generations and the user's API."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from slurm_elastic.decide import worker as decide
from slurm_elastic.decide.batching import MicroBatch, StepPlan, plan_step
from slurm_elastic.errors import UsageError
from slurm_elastic.ledger import LedgerError, LedgerWriter
from slurm_elastic.wire.messages import Committed, Phase
from slurm_elastic.worker.callbacks import Callbacks
from slurm_elastic.worker.input.prefetch import Prefetcher
from slurm_elastic.worker.membership.comm import CollectiveFailed, Interrupted
from slurm_elastic.worker.membership.runtime import Runtime
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.settings import JobSettings
from slurm_elastic.worker.step import Step
from slurm_elastic.worker.strategy import Checkpoints, Strategy
from slurm_elastic.worker.usage import LoopState


class Stepper:
    def __init__(
        self,
        settings: JobSettings,
        runtime: Runtime,
        strategy: Strategy,
        prefetch: Prefetcher,
        checkpoints: Checkpoints | None,
        phases: PhaseHooks,
        usage: LoopState,
        hooks: Callbacks,
    ) -> None:
        self.seed = settings.seed  # (StepHost)
        self.settings = settings
        self.runtime = runtime
        self.strategy = strategy
        self.prefetch = prefetch
        self.checkpoints = checkpoints
        self.phases = phases
        self.usage = usage
        self.hooks = hooks
        self.ledger: LedgerWriter | None = None  # opened once the job's run number is known
        self.plan: StepPlan = plan_step(settings.batch_policy(None, None), 1)
        self.loss: float | None = None  # the last committed step's mean loss over its whole global batch
        self.live: Step | None = None  # the step attempt between its start and its commit (or abort)
        self.boundary_due = False  # a rank asked for a membership change in the last committed step

    # --- what a Step asks (StepHost) ------------------------------------------------------------------

    def interrupted(self) -> bool:
        return self.runtime.interrupt.is_set()

    def batch(self, start: int, size: int) -> Any:
        return self.prefetch.get(start, size)

    def set_phase(self, phase: Phase) -> None:
        self.runtime.set_phase(self.strategy.held.step, phase)

    def backward_micro_batch(self, step: Step, mb: MicroBatch, loss: torch.Tensor, closing: bool) -> None:
        if closing:
            self._contribute(step)
        self.strategy.backward(loss, mb, closing)

    def close_without_micro_batches(self, step: Step) -> None:
        self._contribute(step)
        self.strategy.contribute_nothing()

    # --- plans, events, the ledger --------------------------------------------------------------------

    def replan(self) -> None:
        """A generation is formed: plan its steps."""
        held = self.strategy.held
        self.plan = plan_step(self.settings.batch_policy(held.global_batch, held.reference_world), self.runtime.world)
        self.boundary_due = False

    def mine(self) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches of a step."""
        return self.strategy.micro_batches(self.plan, self.runtime.rank)

    def generation_fields(self) -> dict[str, Any]:
        """What a `generation_ready` event says of the step: the batch policy and how the strategy trains."""
        plan = {"batch_policy": self.plan.reason, "lr_factor": self.plan.lr_factor}
        return plan | self.strategy.generation_fields()

    def open_ledger(self, directory: Path | None, worker_id: str, run: int) -> None:
        # The run is the whole job's (requeues of the core job), never a satellite's own restart count.
        if directory is not None:
            self.ledger = LedgerWriter(directory, worker_id, run)

    def close_ledger(self) -> None:
        if self.ledger:
            self.ledger.close()
            self.ledger = None

    def _contribute(self, step: Step) -> None:
        # On record before any sum starts: a peer may commit the step with this rank's samples in it.
        if self.ledger:
            generation = self.runtime.generation
            self._ledger_write(lambda ledger: ledger.contribute(generation, step.number, step.ranges))

    def _ledger_write(self, write: Callable[[LedgerWriter], None]) -> None:
        """A ledger that cannot be written (a full disk) is reported once and closed; training goes on."""
        assert self.ledger is not None
        try:
            write(self.ledger)
        except LedgerError as exc:
            self.runtime.report("ledger_failed", {"error": str(exc), "step": self.strategy.held.step})
            self.ledger.close()
            self.ledger = None

    # --- one step -------------------------------------------------------------------------------------

    def new_attempt(self) -> Step:
        rt, strategy = self.runtime, self.strategy
        number = strategy.held.step + 1
        strategy.begin(rt.group, number)
        self.live = Step(self, number, strategy.held.cursor, self.mine(), rt.rank, rt.world)
        return self.live

    def conclude(self, attempt: Step) -> tuple[decide.AttemptOutcome, str]:
        self.live = None
        if attempt.aborted:
            return "aborted", "generation superseded during the step"
        if not attempt.complete:
            error = UsageError(
                f"the loop left step {attempt.number} before its last micro-batch: iterate every micro-batch "
                "of every step (use job.steps() or job.micro_batches() without break)"
            )
            self.usage.broke(error)
            raise error
        try:
            self._commit(attempt)
        except (Interrupted, CollectiveFailed) as exc:
            return "failed", str(exc)
        assert self.loss is not None
        held = self.strategy.held
        self.hooks.committed(held.step, self.loss, held.cursor)
        return "committed", ""

    def _commit(self, attempt: Step) -> None:
        rt, strategy = self.runtime, self.strategy
        held = strategy.held
        self.set_phase("allreduce")
        self.phases.fire("allreduce", attempt.number)
        loss, change_wanted = strategy.finish()
        self.set_phase("optimizer")
        strategy.commit(attempt.number, self.plan)
        self.loss = loss
        if self.ledger:
            self._ledger_write(lambda ledger: ledger.commit(rt.generation, held.step, held.cursor))
        if rt.rank == 0:
            rt.send(
                Committed(
                    generation=rt.generation,
                    step=held.step,
                    loss=loss,
                    samples=self.plan.step_samples,
                    world=rt.world,
                    time=time.time(),
                )
            )
        if self.checkpoints:
            self.checkpoints.after_commit(held, rt.rank)
        self.boundary_due = change_wanted


__all__ = ["Stepper"]
