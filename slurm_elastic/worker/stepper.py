"""One step of an ElasticJob: what a `Step` asks of the job (batches, phases, backward), and how an
attempt is started, concluded and committed. `ElasticJob` (job.py) builds on this and adds the loops,
the generations and the user's API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from slurm_elastic.data.order import SampleOrder
from slurm_elastic.decide import worker as decide
from slurm_elastic.decide.batching import (
    BatchPolicy,
    LrRule,
    MicroBatch,
    PreserveGlobalBatch,
    ScaleLearningRate,
    StepPlan,
)
from slurm_elastic.errors import UsageError
from slurm_elastic.ledger import LedgerError, LedgerWriter
from slurm_elastic.logs import get_logger
from slurm_elastic.wire.messages import Committed, Phase, WorkerEvent
from slurm_elastic.worker.callbacks import Callbacks
from slurm_elastic.worker.comm import CollectiveFailed, Interrupted
from slurm_elastic.worker.data import Samples
from slurm_elastic.worker.env import WorkerEnv
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.prefetch import Prefetcher
from slurm_elastic.worker.reduction import GradientReducer
from slurm_elastic.worker.replica import Replica
from slurm_elastic.worker.runtime import Runtime
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.sharded.step import ShardedStep
from slurm_elastic.worker.step import Step
from slurm_elastic.worker.usage import LoopState

log = get_logger("slurm_elastic.worker")


class Checkpoints(Protocol):
    """Disaster-recovery checkpoints: a replica's (`worker.checkpoint`) or a sharded job's (`sharded.checkpoint`)."""

    def load_into(self, replica: Any) -> bool: ...

    def after_commit(self, replica: Any, rank: int) -> None: ...

    def save_now(self, replica: Any) -> None: ...

    def close(self) -> None: ...


class StepRunner:
    """The step-level half of ElasticJob; the attributes are set by ElasticJob's constructor."""

    env: WorkerEnv
    seed: int
    _runtime: Runtime
    _replica: Replica | ShardedReplica
    _reducer: GradientReducer | None  # None for a sharded model: FSDP2 sums the gradients
    _sharded: ShardedStep | None
    _prefetch: Prefetcher
    _ledger: LedgerWriter | None
    _checkpoints: Checkpoints | None
    _phases: PhaseHooks
    _dataset: Samples
    _order: SampleOrder
    _collate: Callable[[list[Any]], Any]
    _global_batch: int | None
    _per_replica: int | None
    _micro: int
    _lr_rule: LrRule
    _plan: StepPlan
    _clip: float | None
    _params: list[torch.nn.Parameter]
    _boundary_due: bool
    _live: Step | None
    _loss: float | None
    _usage: LoopState
    _hooks: Callbacks

    def interrupted(self) -> bool:
        raise NotImplementedError

    # --- what a Step asks (StepHost) ------------------------------------------------------------------

    def batch(self, start: int, size: int) -> Any:
        return self._prefetch.get(start, size)

    def set_phase(self, phase: Phase) -> None:
        self._runtime.set_phase(self._replica.step, phase)

    def backward_micro_batch(self, step: Step, mb: MicroBatch, loss: torch.Tensor, closing: bool) -> None:
        if closing:
            self._contribute(step)
        if self._sharded:
            self._phases.fire("backward", step.number)
            self._sharded.backward(loss, mb.weight)
            return
        assert self._reducer is not None
        self._reducer.add_control(loss, mb.weight, self._runtime.change_requested() if closing else None)
        self._reducer.backward(loss, mb.weight, closing=closing)

    def close_without_micro_batches(self, step: Step) -> None:
        assert self._reducer is not None  # a sharded job's ranks always run passes (lockstep)
        self._contribute(step)
        self._reducer.add_control(torch.zeros(()), 0.0, self._runtime.change_requested())
        self._reducer.launch_rest()

    def _contribute(self, step: Step) -> None:
        # On record before any sum starts: a peer may commit the step with this rank's samples in it.
        if self._ledger:
            generation = self._runtime.generation
            self._ledger_write(lambda ledger: ledger.contribute(generation, step.number, step.ranges))

    def _ledger_write(self, write: Callable[[LedgerWriter], None]) -> None:
        """A ledger that cannot be written (a full disk) is reported once and closed; training goes on."""
        assert self._ledger is not None
        try:
            write(self._ledger)
        except LedgerError as exc:
            self._report("ledger_failed", {"error": str(exc), "step": self._replica.step})
            self._ledger.close()
            self._ledger = None

    def _report(self, kind: str, fields: dict[str, Any]) -> None:
        """One structured event about this worker, through the coordinator (and this process's log)."""
        log.warning(kind, worker=self.env.worker_id, **fields)
        self._runtime.send(WorkerEvent(kind=kind, fields=fields))  # the coordinator adds the worker's id

    def _load_batch(self, start: int, size: int) -> Any:
        return self._collate([self._dataset[int(i)] for i in self._order.indices(start, size)])

    # --- one step -------------------------------------------------------------------------------------

    def _policy(self) -> BatchPolicy:
        if self._per_replica is None:  # the script's global batch, else the first generation's (see _entered)
            return PreserveGlobalBatch(self._global_batch or self._replica.global_batch or self._micro, self._micro)
        return ScaleLearningRate(self._per_replica, self._micro, self._replica.reference_world or 1, self._lr_rule)

    def _mine(self) -> tuple[MicroBatch, ...]:
        """This rank's micro-batches of a step; a sharded job's ranks all run as many passes (padding)."""
        rank = self._runtime.rank
        return self._plan.lockstep(rank) if self._sharded else self._plan.for_rank(rank)

    def _generation_fields(self) -> dict[str, Any]:
        """What a `generation_ready` event says of the step: the batch policy and how gradients are summed."""
        fields: dict[str, Any] = {"batch_policy": self._plan.reason, "lr_factor": self._plan.lr_factor}
        if self._reducer:
            fields |= {"reduce_dtype": self._reducer.reduce_dtype, "buckets": self._reducer.bucket_count}
        if self._sharded:
            replica = self._sharded.replica
            fields |= {"strategy": "fsdp2", "mirrors": replica.wards is not None}
            if replica.layout is not None:
                fields |= {"shard_group": replica.layout.shards, "replica_groups": replica.layout.replicas}
        return fields

    def _new_attempt(self) -> Step:
        rt = self._runtime
        number = self._replica.step + 1
        if self._sharded:
            assert rt.group is not None
            hit = lambda kind: self._phases.fire("reduce_scatter", number) if kind == "reduce-scatter" else None  # noqa: E731
            self._sharded.begin(rt.group, number, hit)
            return Step(self, number, self._replica.cursor, self._mine(), rt.rank, rt.world)
        assert self._reducer is not None
        group = rt.group if rt.world > 1 else None
        self._reducer.begin(group, on_launch=lambda _bucket: self._phases.fire("bucket", number))
        micro = self._plan.for_rank(rt.rank)
        return Step(self, number, self._replica.cursor, micro, rt.rank, rt.world)

    def _conclude(self, attempt: Step) -> tuple[decide.AttemptOutcome, str]:
        self._live = None
        if attempt.aborted:
            return "aborted", "generation superseded during the step"
        if not attempt.complete:
            error = UsageError(
                f"the loop left step {attempt.number} before its last micro-batch: iterate every micro-batch "
                "of every step (use job.steps() or job.micro_batches() without break)"
            )
            self._usage.broke(error)
            raise error
        try:
            self._commit(attempt)
        except (Interrupted, CollectiveFailed) as exc:
            return "failed", str(exc)
        assert self._loss is not None
        self._hooks.committed(self._replica.step, self._loss, self._replica.cursor)
        return "committed", ""

    def _commit(self, attempt: Step) -> None:
        rt, replica = self._runtime, self._replica
        self.set_phase("allreduce")
        self._phases.fire("allreduce", attempt.number)
        if self._sharded:
            loss, change_wanted, norm2 = self._sharded.finish(rt.change_requested())
            self.set_phase("optimizer")
            self._phases.fire("optimizer", attempt.number)  # the job steps the shards, not the script's optimizer
            self._phases.fire("commit", attempt.number)
            self._sharded.commit(self._plan.step_samples, norm2, self._plan.lr_factor)
        else:
            assert self._reducer is not None and isinstance(replica, Replica)
            loss, change_wanted = self._reducer.wait()
            self.set_phase("optimizer")
            if self._clip is not None:
                torch.nn.utils.clip_grad_norm_(self._params, self._clip)
            replica.optimizer_step(self._plan.lr_factor)
            self._reducer.after_optimizer()
            self._phases.fire("commit", attempt.number)
            replica.commit(attempt.number, self._plan.step_samples)
        self._loss = loss
        if self._ledger:
            self._ledger_write(lambda ledger: ledger.commit(rt.generation, replica.step, replica.cursor))
        if rt.rank == 0:
            rt.send(
                Committed(
                    generation=rt.generation,
                    step=replica.step,
                    loss=loss,
                    samples=self._plan.step_samples,
                    world=rt.world,
                    time=time.time(),
                )
            )
        if self._checkpoints:
            self._checkpoints.after_commit(replica, rt.rank)
        self._boundary_due = change_wanted
