"""`ElasticJob`: the worker library that turns a data-parallel training loop into an elastic one.

    job = ElasticJob(model, optimizer, scheduler, dataset=data, global_batch=64, micro_batch=8)
    for step in job.steps(1000):
        for x, y in step.micro_batches():
            step.backward(loss_fn(model(x), y))

A step is the unit of atomicity. This rank's micro-batches accumulate; during the last one's backward the
gradients are summed over the ranks in buckets as they become ready (`reduction.py`), together with the
step's loss and a "membership change wanted" flag; then the optimizer step, the scheduler step and the data
cursor commit together. A failure before a rank's sums complete rolls that rank back to the start of the
step, in memory; survivors re-form the group and re-run the same global samples. A rank whose sums
completed is a step ahead and heals the others. What to do next is decided by `decide.worker.next_move`.

A worker's process ends one way only: `_end`, which raises `JobEnded` (a SystemExit carrying the exit code)
when the worker left the job, the job stopped or failed, or the coordinator was lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol

import structlog
import torch
from torch.utils.data import default_collate

from slurm_elastic.data.order import SampleOrder
from slurm_elastic.decide import worker as decide
from slurm_elastic.decide.batching import (
    BatchPolicy,
    LrRule,
    MicroBatch,
    PreserveGlobalBatch,
    ScaleLearningRate,
    plan_step,
)
from slurm_elastic.errors import ConfigError, ElasticError, JobFailed
from slurm_elastic.faults import FaultInjector
from slurm_elastic.ledger import LedgerError, LedgerWriter
from slurm_elastic.wire.messages import AtBoundary, Committed, Finished, Phase, WorkerEvent
from slurm_elastic.worker.checkpoint import DisasterRecovery
from slurm_elastic.worker.comm import CollectiveFailed, Interrupt, Interrupted
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.prefetch import Prefetcher
from slurm_elastic.worker.process import ProcessHooks
from slurm_elastic.worker.reduction import DEFAULT_BUCKET_MB, GradientReducer, reduce_dtype_of
from slurm_elastic.worker.replica import Replica
from slurm_elastic.worker.runtime import Runtime, WorkerEnded
from slurm_elastic.worker.sharded.checkpoint import ShardedCheckpoints
from slurm_elastic.worker.sharded.holder import ShardedReplica
from slurm_elastic.worker.sharded.remesh import is_sharded
from slurm_elastic.worker.sharded.step import ShardedStep
from slurm_elastic.worker.step import Step

log = structlog.get_logger("slurm_elastic.worker")
DEFAULT_PREFETCH = 4


class Samples(Protocol):
    """A map-style data set, as torch's DataLoader takes: `len(data)` samples, `data[i]` the i-th."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class Checkpoints(Protocol):
    """Disaster-recovery checkpoints: a replica's (`worker.checkpoint`) or a sharded job's (`sharded.checkpoint`)."""

    def load_into(self, replica: Any) -> bool: ...

    def after_commit(self, replica: Any, rank: int) -> None: ...

    def save_now(self, replica: Any) -> None: ...

    def close(self) -> None: ...


class JobEnded(SystemExit):
    """This worker's process ends: it left the job, the job stopped or failed, or the coordinator was lost."""

    def __init__(self, ending: decide.Ending) -> None:
        super().__init__(ending.code)
        self.ending = ending


class ElasticJob:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None = None,
        *,
        dataset: Samples,
        micro_batch: int,
        global_batch: int | None = None,
        per_replica_batch: int | None = None,
        lr_rule: LrRule = "linear",
        reference_world: int | None = None,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        clip_grad_norm: float | None = None,
        reduce_dtype: str | None = None,
        bucket_mb: float | None = None,
        prefetch: int | None = None,
        env: WorkerEnv | None = None,
        ports: Ports | None = None,
    ) -> None:
        if (global_batch is None) == (per_replica_batch is None):
            raise ConfigError("give exactly one of global_batch (preserve the global batch) or per_replica_batch")
        self.env = env or worker_env()
        self.seed = seed
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self._sharded: ShardedStep | None = None
        self._replica: Replica | ShardedReplica
        if is_sharded(model):  # fully_shard (FSDP2): shards held twice, re-sharded from peers (docs/fsdp.md)
            if reduce_dtype not in (None, "float32"):
                raise ConfigError(
                    f"invalid reduce_dtype {reduce_dtype!r} for a fully_shard model: FSDP2 sums in float32"
                )
            self._replica = ShardedReplica(model, optimizer, scheduler)
            self._replica.clip = clip_grad_norm
            self._sharded = ShardedStep(self._replica)
        else:
            self._replica = Replica(model, optimizer, scheduler)
        self._replica.reference_world = reference_world
        self._dataset = dataset
        self._order = SampleOrder(len(dataset), seed)
        self._collate = collate_fn or default_collate
        self._clip = clip_grad_norm
        self._global_batch, self._per_replica, self._micro = global_batch, per_replica_batch, micro_batch
        self._lr_rule: LrRule = lr_rule
        self._plan = plan_step(self._policy(), 1)  # validates the batch arguments now, with a clear error
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device if params else torch.device("cpu")
        dtype = reduce_dtype_of("float32" if self._sharded else reduce_dtype or self.env.reduce_dtype or "float32")
        self._reducer = (
            None
            if self._sharded
            else GradientReducer(params, dtype, bucket_mb=bucket_mb or self.env.bucket_mb or DEFAULT_BUCKET_MB)
        )
        depth = prefetch if prefetch is not None else self.env.prefetch
        self._prefetch = Prefetcher(
            self._load_batch,
            DEFAULT_PREFETCH if depth is None else depth,
            pin_memory=device.type == "cuda",
        )
        self._params = params
        self._interrupt = Interrupt()
        ports = ports or Ports()
        self._ports = ports
        self._faults = ports.faults or FaultInjector(
            self.env.faults, self.env.node, self.env.local_rank, self.env.incarnation
        )
        self._runtime = Runtime(self.env, ports, self._faults, self._interrupt)
        self._boundary_due = False
        self._total_steps = 0  # what the loop asked for (bounds how far batches are read ahead)
        self._attempt: Step | None = None
        self._process = ProcessHooks(self.env.node, self.env.worker_id, self._runtime.send)
        self._started = False
        self._ledger: LedgerWriter | None = None  # opened once the job's run number is known
        ckpt = self.env.checkpoint_dir
        kind = ShardedCheckpoints if self._sharded else DisasterRecovery
        self._checkpoints: Checkpoints | None = (
            kind(ckpt, self.env.checkpoint_every, self.env.checkpoint_background, self._report) if ckpt else None
        )
        self._runtime.checkpoints = self._checkpoints is not None
        self._runtime.sharded = self._sharded is not None
        if isinstance(self._replica, ShardedReplica):
            self._faults_corrupt()
        if self._faults.armed:
            self._install_fault_hooks()

    # --- public ---------------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._runtime.rank

    @property
    def world_size(self) -> int:
        return self._runtime.world

    @property
    def generation(self) -> int:
        return self._runtime.generation

    @property
    def step(self) -> int:
        """Committed optimizer steps."""
        return self._replica.step

    @property
    def cursor(self) -> int:
        """Committed position in the global sample stream."""
        return self._replica.cursor

    @property
    def reduce_dtype(self) -> str:
        return self._reducer.reduce_dtype if self._reducer else "float32"

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Yield step attempts until `total_steps` optimizer steps are committed."""
        if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 1:
            raise ConfigError(f"invalid total_steps {total_steps!r}: expected an integer >= 1")
        self._total_steps = total_steps
        try:
            self._start()
            outcome: decide.AttemptOutcome = "none"
            detail = ""
            while True:
                situation = decide.Situation(
                    self.step, total_steps, outcome, self._runtime.superseded(), self._boundary_due, detail
                )
                outcome, detail = "none", ""
                match decide.next_move(situation):
                    case decide.RunStep():
                        attempt = self._new_attempt()
                        yield attempt
                        outcome, detail = self._conclude(attempt)
                    case decide.Recover(patient=patient):
                        self._recover(patient=patient)
                    case decide.CrossBoundary():
                        self._cross_boundary()
                    case decide.Finish():
                        self._finish()
                        return
        except WorkerEnded as ended:
            self._end(ended.ending)

    def micro_batches(self, total_steps: int) -> Iterator[Any]:
        """The flat form of `steps()`: this rank's micro-batches, step after step; call `backward(loss)` on each."""
        for attempt in self.steps(total_steps):
            self._attempt = attempt
            yield from attempt.micro_batches()

    def backward(self, loss: torch.Tensor) -> None:
        if self._attempt is None:
            raise ElasticError("job.backward() must be called inside `for batch in job.micro_batches(...)`")
        self._attempt.backward(loss)

    def interrupted(self) -> bool:
        return self._interrupt.is_set()

    def close(self) -> None:
        self._prefetch.close()
        if self._checkpoints:
            self._checkpoints.close()
        if self._ledger:
            self._ledger.close()
            self._ledger = None
        self._runtime.close()

    # --- what a Step asks (StepHost) ------------------------------------------------------------------

    def batch(self, start: int, size: int) -> Any:
        return self._prefetch.get(start, size)

    def set_phase(self, phase: Phase) -> None:
        self._runtime.set_phase(self.step, phase)

    def backward_micro_batch(self, step: Step, mb: MicroBatch, loss: torch.Tensor, closing: bool) -> None:
        if closing:
            self._contribute(step)
        if self._sharded:
            self._faults.hit("backward", step.number)
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
            self._ledger_write(lambda ledger: ledger.contribute(self.generation, step.number, step.ranges))

    def _ledger_write(self, write: Callable[[LedgerWriter], None]) -> None:
        """A ledger that cannot be written (a full disk) is reported once and closed; training goes on."""
        assert self._ledger is not None
        try:
            write(self._ledger)
        except LedgerError as exc:
            self._report("ledger_failed", {"error": str(exc), "step": self.step})
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
        if self._global_batch is not None:
            return PreserveGlobalBatch(self._global_batch, self._micro)
        assert self._per_replica is not None
        return ScaleLearningRate(self._per_replica, self._micro, self._replica.reference_world or 1, self._lr_rule)

    def _new_attempt(self) -> Step:
        number = self.step + 1
        if self._sharded:
            assert self._runtime.group is not None
            hit = lambda kind: self._faults.hit("reduce_scatter", number) if kind == "reduce-scatter" else None  # noqa: E731
            self._sharded.begin(self._runtime.group, number, hit)
            return Step(self, number, self.cursor, self._plan.lockstep(self.rank), self.rank, self.world_size)
        assert self._reducer is not None
        group = self._runtime.group if self.world_size > 1 else None
        self._reducer.begin(group, on_launch=lambda _bucket: self._faults.hit("bucket", number))
        micro = self._plan.for_rank(self.rank)
        return Step(self, number, self.cursor, micro, self.rank, self.world_size)

    def _conclude(self, attempt: Step) -> tuple[decide.AttemptOutcome, str]:
        if attempt.aborted:
            return "aborted", "generation superseded during the step"
        if not attempt.complete:
            raise ElasticError(
                f"the loop left step {attempt.number} before its last micro-batch: iterate every micro-batch "
                "of every step (use job.steps() or job.micro_batches() without break)"
            )
        try:
            self._commit(attempt)
        except (Interrupted, CollectiveFailed) as exc:
            return "failed", str(exc)
        return "committed", ""

    def _commit(self, attempt: Step) -> None:
        self.set_phase("allreduce")
        self._faults.hit("allreduce", attempt.number)
        if self._sharded:
            loss, change_wanted, norm2 = self._sharded.finish(self._runtime.change_requested())
            self.set_phase("optimizer")
            self._faults.hit("commit", attempt.number)
            self._sharded.commit(self._plan.step_samples, norm2, self._plan.lr_factor)
        else:
            assert self._reducer is not None and isinstance(self._replica, Replica)
            loss, change_wanted = self._reducer.wait()
            self.set_phase("optimizer")
            if self._clip is not None:
                torch.nn.utils.clip_grad_norm_(self._params, self._clip)
            self._replica.optimizer_step(self._plan.lr_factor)
            self._reducer.after_optimizer()
            self._faults.hit("commit", attempt.number)
            self._replica.commit(attempt.number, self._plan.step_samples)
        if self._ledger:
            self._ledger_write(lambda ledger: ledger.commit(self.generation, self.step, self.cursor))
        if self.rank == 0:
            self._runtime.send(
                Committed(
                    generation=self.generation,
                    step=self.step,
                    loss=loss,
                    samples=self._plan.step_samples,
                    world=self.world_size,
                    time=time.time(),
                )
            )
        if self._checkpoints:
            self._checkpoints.after_commit(self._replica, self.rank)
        self._boundary_due = change_wanted

    # --- generations ----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        env = self.env
        if env.standalone:
            self._open_ledger(env.run)
            if self._checkpoints:
                self._checkpoints.load_into(self._replica)
            self._replica.fresh = False
            self._runtime.solo()
            self._entered()
            return
        settings = self._runtime.register(-1)
        self._open_ledger(settings.run)
        if settings.load_checkpoint and self._checkpoints:  # the job (re)starts; a joiner's state is never on disk
            self._checkpoints.load_into(self._replica)
        if self._ports.process_hooks:
            self._process.install()
        self._recover(patient=True)

    def _open_ledger(self, run: int) -> None:
        # The run is the whole job's (requeues of the core job), never a satellite's own restart count.
        if self.env.ledger_dir is not None:
            self._ledger = LedgerWriter(self.env.ledger_dir, self.env.worker_id, run)

    def _recover(self, *, patient: bool) -> None:
        if self._reducer:
            self._reducer.abandon()  # an abandoned sum may still write into the old buffers
        entered = self._runtime.recover(self._replica, patient=patient)
        self._entered()
        extra: dict[str, Any] = {"batch_policy": self._plan.reason, "lr_factor": self._plan.lr_factor}
        if self._reducer:
            extra |= {"reduce_dtype": self._reducer.reduce_dtype, "buckets": self._reducer.bucket_count}
        if isinstance(self._replica, ShardedReplica):
            extra |= {"strategy": "fsdp2", "mirrors": self._replica.wards is not None}
        self._runtime.report_generation(entered, extra)

    def _entered(self) -> None:
        """A generation is formed: plan its steps and the batches this rank will read."""
        if self._replica.reference_world is None:
            self._replica.reference_world = self.world_size
        self._plan = plan_step(self._policy(), self.world_size)
        self._boundary_due = False
        self._prefetch.plan(self._schedule())

    def _schedule(self) -> Iterator[tuple[int, int]]:
        plan, cursor = self._plan, self.cursor
        mine = plan.lockstep(self.rank) if self._sharded else plan.for_rank(self.rank)
        for k in range(max(0, self._total_steps - self.step)):
            base = cursor + k * plan.step_samples
            for mb in mine:
                yield base + mb.offset, mb.size

    def _cross_boundary(self) -> None:
        self.set_phase("boundary")
        self._runtime.send(AtBoundary(generation=self.generation, step=self.step))
        self._recover(patient=True)

    def _finish(self) -> None:
        """Leave only once every member holds the final step (a failed barrier heals the laggards first)."""
        while not self._runtime.standalone:
            try:
                group = self._runtime.group
                if group:
                    group.allreduce_(torch.tensor([float(self.step)], dtype=torch.float64, device=group.device))
                break
            except (Interrupted, CollectiveFailed):
                self._recover(patient=False)
        self.set_phase("done")
        self._runtime.send(Finished(generation=self.generation, step=self.step))
        if self._checkpoints:
            self._checkpoints.save_now(self._replica)
        self.close()

    def _end(self, ending: decide.Ending) -> NoReturn:
        """The one way a worker's process ends (see the module's docstring)."""
        if ending.save_checkpoint and self._checkpoints:
            self._checkpoints.save_now(self._replica)  # a suspended job resumes from here
        log_at = log.error if ending.code else log.info
        log_at("worker_ending", worker=self.env.worker_id, kind=ending.kind, reason=ending.reason, step=self.step)
        self.close()
        self._process.exit_code = ending.code
        raise JobEnded(ending)

    # --- faults ---------------------------------------------------------------------------------------

    def _faults_corrupt(self) -> None:
        """A "corrupt" fault flips bits in this rank's own copy of its shard; the sharded job reports events."""
        replica = self._replica
        assert isinstance(replica, ShardedReplica)
        replica.on_refused = lambda line: self._report("shard_refused", {"detail": line, "step": self.step})
        if isinstance(self._faults, FaultInjector):
            self._faults.corrupt = replica.corrupt_own

    def _install_fault_hooks(self) -> None:
        faults = self._faults
        self.model.register_forward_pre_hook(lambda *_: faults.hit("forward", self.step + 1))
        if self._params and not self._sharded:  # a sharded job's parameters are replaced on re-shard
            self._params[0].register_hook(lambda grad: faults.hit("backward", self.step + 1))
        self.optimizer.register_step_pre_hook(lambda *_: faults.hit("optimizer", self.step + 1))


__all__ = ["ElasticJob", "JobEnded", "JobFailed"]
