"""`ElasticJob`: the worker library that turns a data-parallel training loop into an elastic one.

    job = ElasticJob(model, optimizer, scheduler, dataset=data, global_batch=64, micro_batch=8)
    for step in job.steps(1000):
        for x, y in step.micro_batches():
            step.backward(loss_fn(model(x), y))

A step is the unit of atomicity: gradients accumulate (in float64) in a buffer, one reduction sums them
over the ranks together with the step's loss and a "membership change wanted" flag, then the optimizer
step, the scheduler step and the data cursor commit together. A failure before a rank's reduction
completes rolls that rank back to the start of the step, in memory; survivors re-form the group and
re-run the same global samples. A rank whose reduction completed is a step ahead and heals the others.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import structlog
import torch
from pydantic import BaseModel
from torch.utils.data import default_collate

from slurm_elastic.data.order import SampleOrder
from slurm_elastic.decide.batching import BatchPolicy, LrRule, PreserveGlobalBatch, ScaleLearningRate, plan_step
from slurm_elastic.errors import ConfigError, ElasticError, JobFailed
from slurm_elastic.faults import FaultInjector
from slurm_elastic.ledger import LedgerWriter
from slurm_elastic.wire.messages import (
    Assign,
    AtBoundary,
    CollectiveFault,
    Committed,
    Finished,
    Leave,
    Phase,
    Stop,
    WorkerEvent,
)
from slurm_elastic.worker.checkpoint import CheckpointWriter, load_latest
from slurm_elastic.worker.comm import CollectiveFailed, Group, Interrupt, Interrupted, pick_backend
from slurm_elastic.worker.control import Announcement, ControlClient, CoordinatorLost, Identity, JobOver
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.process import ProcessHooks
from slurm_elastic.worker.state import Snapshot, capture, fingerprint, restore
from slurm_elastic.worker.step import Step
from slurm_elastic.worker.sync import synchronize

log = structlog.get_logger("slurm_elastic.worker")

# How long a worker whose collective failed waits for the coordinator's new generation before asking
# for one itself (the usual path, a lost peer, brings the generation in milliseconds).
FAULT_GRACE_S = 1.0
EXIT_COORDINATOR_LOST = 3


class ElasticJob:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None = None,
        *,
        dataset: Sequence[Any],
        micro_batch: int,
        global_batch: int | None = None,
        per_replica_batch: int | None = None,
        lr_rule: LrRule = "linear",
        reference_world: int | None = None,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        clip_grad_norm: float | None = None,
        env: WorkerEnv | None = None,
    ) -> None:
        if (global_batch is None) == (per_replica_batch is None):
            raise ConfigError("give exactly one of global_batch (preserve the global batch) or per_replica_batch")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.seed = seed
        self.env = env or worker_env()
        self._dataset = dataset
        self._order = SampleOrder(len(dataset), seed)
        self._collate = collate_fn or default_collate
        self._clip = clip_grad_norm
        self._global_batch, self._per_replica, self._micro = global_batch, per_replica_batch, micro_batch
        self._lr_rule: LrRule = lr_rule
        self._reference_world = reference_world
        self._policy()  # validate the batch arguments now, with a clear error
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._numel = sum(p.numel() for p in self._params)
        self._device = self._params[0].device if self._params else torch.device("cpu")
        self.rank, self.world_size, self.generation = 0, 1, 0
        self.step = 0  # committed optimizer steps
        self.cursor = 0  # committed position in the global sample stream
        self._fresh = True  # holds no committed state yet
        self._interrupt = Interrupt()
        self._group: Group | None = None
        self._control: ControlClient | None = None
        self._store: Any = None
        self._store_address: tuple[str, int] = ("", 0)
        self._store_prefix = ""
        self._plan = plan_step(self._policy(), 1)
        self._acc = self._new_accumulator()
        self._boundary_due = False
        self._attempt: Step | None = None
        self._process = ProcessHooks(self.env.node, self.env.worker_id, self._send)
        self._started = False
        self._faults = FaultInjector(self.env.faults, self.env.node, self.env.local_rank, self.env.incarnation)
        self._ledger: LedgerWriter | None = None  # opened once the job's run number is known
        ckpt = self.env.checkpoint_dir
        self._checkpoints = CheckpointWriter(ckpt, background=self.env.checkpoint_background) if ckpt else None
        if self._faults.armed:
            self._install_fault_hooks()

    # --- public ---------------------------------------------------------------------------------------

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Yield step attempts until `total_steps` optimizer steps are committed."""
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"invalid total_steps {total_steps!r}: expected an integer >= 1")
        self._start()
        while self.step < total_steps:
            if self._boundary_due:
                self._cross_boundary()
                continue
            attempt = Step(self, self.step + 1, self._plan.for_rank(self.rank), self._plan.lr_factor)
            yield attempt
            self._finish_attempt(attempt)
        self._finish()

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
        if self._checkpoints:
            self._checkpoints.wait()
        if self._ledger:
            self._ledger.close()
            self._ledger = None
        if self._control:
            self._control.close()
            self._control = None

    # --- used by Step ---------------------------------------------------------------------------------

    def load_batch(self, start: int, size: int) -> Any:
        return self._collate([self._dataset[int(i)] for i in self._order.indices(start, size)])

    def _send(self, message: BaseModel) -> None:
        if self._control is not None:
            self._control.send(message)

    def set_phase(self, phase: Phase) -> None:
        if self._control:
            self._control.progress = (self.generation, self.step, phase)

    def accumulate(self, weight: float, loss: torch.Tensor) -> None:
        acc, offset = self._acc, 0
        for p in self._params:
            n = p.numel()
            if p.grad is not None:
                acc[offset : offset + n].add_(p.grad.reshape(-1), alpha=weight)
                p.grad = None
            offset += n
        acc[self._numel : self._numel + 1].add_(loss.detach().reshape(1).to(acc.dtype), alpha=weight)

    # --- the step's reduction and commit -------------------------------------------------------------

    def _policy(self) -> BatchPolicy:
        if self._global_batch is not None:
            return PreserveGlobalBatch(self._global_batch, self._micro)
        assert self._per_replica is not None
        return ScaleLearningRate(self._per_replica, self._micro, self._reference_world or 1, self._lr_rule)

    def _new_accumulator(self) -> torch.Tensor:
        # [gradients..., loss, change flag], float64 so the sum does not depend on how ranks split the work.
        return torch.zeros(self._numel + 2, dtype=torch.float64, device=self._device)

    def _finish_attempt(self, attempt: Step) -> None:
        if not attempt.aborted:
            try:
                self._reduce_and_commit(attempt)
            except (Interrupted, CollectiveFailed) as exc:
                self._recover(str(exc))
                return
            if not self._interrupt.is_set():
                return
        self._recover("generation superseded")

    def _reduce_and_commit(self, attempt: Step) -> None:
        acc, n = self._acc, self._numel
        acc[n + 1] = 1.0 if self._control and self._control.change_requested() else 0.0
        if self._ledger:
            self._ledger.contribute(self.generation, attempt.number, attempt.ranges)
        self.set_phase("allreduce")
        wait = self._group.launch_allreduce(acc) if self._group else (lambda: None)
        self._faults.hit("allreduce", attempt.number)
        wait()
        self.set_phase("optimizer")
        change_wanted, loss = acc[n + 1].item() > 0, acc[n].item()
        offset = 0
        for p in self._params:
            p.grad = acc[offset : offset + p.numel()].view(p.shape).to(p.dtype)
            offset += p.numel()
        if self._clip is not None:
            torch.nn.utils.clip_grad_norm_(self._params, self._clip)
        self._optimizer_step(attempt.lr_factor)
        for p in self._params:
            p.grad = None  # the next step's first backward must not add to this step's gradient
        if self.scheduler is not None:
            self.scheduler.step()
        self._faults.hit("commit", attempt.number)
        self.step, self.cursor, self._fresh = attempt.number, self.cursor + self._plan.step_samples, False
        acc.zero_()
        if self._ledger:
            self._ledger.commit(self.generation, self.step, self.cursor)
        if self.rank == 0 and self._control:
            self._control.send(
                Committed(
                    generation=self.generation,
                    step=self.step,
                    loss=loss,
                    samples=self._plan.step_samples,
                    world=self.world_size,
                    time=time.time(),
                )
            )
        self._maybe_checkpoint()
        self._boundary_due = change_wanted

    def _optimizer_step(self, lr_factor: float) -> None:
        if lr_factor == 1.0:
            self.optimizer.step()
            return
        saved = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * lr_factor
        try:
            self.optimizer.step()
        finally:
            for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
                group["lr"] = lr

    # --- generations ----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        env = self.env
        if env.standalone:
            self._open_ledger(env.run)
            self._load_checkpoint()
            self._fresh = False
            self._enter_solo()
            return
        self._control = ControlClient(
            env.coordinator or "",
            env.secret,
            Identity(env.job_id, env.worker_id, env.node, env.local_rank),
            self._interrupt,
        )
        try:
            settings = self._control.register(-1, os.getpid())
        except JobOver as exc:
            log.info("job_already_over", worker=env.worker_id, reason=str(exc))
            self.close()
            raise SystemExit(0) from None
        self._open_ledger(settings.run)
        if settings.load_checkpoint:  # the job (re)starts: its state may be on disk; a joiner's never is
            self._load_checkpoint()
        self._process.install()
        self._backend = pick_backend(settings.backend)
        self._pg_timeout = settings.pg_timeout_s
        self._store_address = (settings.store_host, settings.store_port)
        self._store_prefix = settings.store_prefix
        self._recover("start", first=True)

    def _open_ledger(self, run: int) -> None:
        # The run is the whole job's (requeues of the core job), never a satellite's own restart count.
        if self.env.ledger_dir is not None:
            self._ledger = LedgerWriter(self.env.ledger_dir, self.env.worker_id, run)

    def _enter_solo(self) -> None:
        if self._reference_world is None:
            self._reference_world = 1
        self._group = Group(None, 0, 1, 1, self._interrupt)
        self.generation, self.rank, self.world_size = 1, 0, 1
        self._plan = plan_step(self._policy(), 1)

    def _recover(self, reason: str, first: bool = False) -> None:
        """Leave the current generation and keep joining announced ones until one is formed and in sync."""
        if self._group:
            self._group.abandon()
            self._group = None
        self._acc = self._new_accumulator()  # an abandoned reduction may still write into the old one
        for p in self._params:
            p.grad = None
        while True:
            announcement = self._next_announcement(first)
            first = False
            try:
                self._enter(announcement)
                return
            except (Interrupted, CollectiveFailed) as exc:
                log.info("generation_attempt_failed", generation=self.generation, reason=str(exc))
                if self._group:
                    self._group.abandon()
                    self._group = None

    def _next_announcement(self, patient: bool) -> Announcement:
        assert self._control is not None
        try:
            ann = self._control.next_announcement(self.generation, None if patient else FAULT_GRACE_S)
            if ann is None:
                self._control.send(
                    CollectiveFault(
                        generation=max(self.generation, 1), step=self.step, detail="no new generation after a fault"
                    )
                )
                ann = self._control.next_announcement(self.generation)
        except CoordinatorLost as exc:
            log.error("coordinator_lost", worker=self.env.worker_id, detail=str(exc))
            self._process.exit_code = EXIT_COORDINATOR_LOST
            self.close()
            raise SystemExit(EXIT_COORDINATOR_LOST) from None
        if isinstance(ann, Leave):
            self._leave(ann.reason)
        if isinstance(ann, Stop):
            self._stop(ann)
        assert ann is not None
        return ann

    def _enter(self, ann: Announcement) -> None:
        assert isinstance(ann, Assign) and self._control is not None
        started = time.monotonic()
        self._control.enter_generation(ann.generation)
        self.generation, self.rank, self.world_size = ann.generation, ann.rank, len(ann.ranks)
        self.set_phase("recovery")
        # A fresh store connection per generation: the client serialises requests, so a blocked call left
        # behind by an abandoned generation (a peer that died mid-rendezvous) must not stall this one.
        self._store = torch.distributed.TCPStore(
            *self._store_address,
            is_master=False,
            timeout=datetime.timedelta(seconds=self._pg_timeout),
            wait_for_workers=False,
        )
        self._group = Group.form(
            self._store,
            self._store_prefix,
            ann.rank,
            len(ann.ranks),
            ann.generation,
            backend=self._backend,
            timeout_s=self._pg_timeout,
            interrupt=self._interrupt,
        )
        formed = time.monotonic()
        self._faults.hit("recovery", self.step + 1)
        was_step = -1 if self._fresh else self.step
        result = synchronize(
            self._group,
            self._store,
            self._store_prefix,
            was_step,
            fingerprint(self.model),
            lambda: capture(self.model, self.optimizer, self.scheduler, self._progress()),
        )
        if result.received is not None:
            self._apply_progress(restore(self.model, self.optimizer, self.scheduler, result.received))
        self._fresh = False
        if self._reference_world is None:
            self._reference_world = self.world_size
        self._plan = plan_step(self._policy(), self.world_size)
        self._boundary_due = False
        if self.rank == 0:
            self._control.send(
                WorkerEvent(
                    kind="generation_ready",
                    fields={
                        "generation": self.generation,
                        "cause": ann.cause,
                        "world": self.world_size,
                        "form_s": round(formed - started, 4),
                        "sync_s": round(result.seconds, 4),
                        "total_s": round(time.monotonic() - started, 4),
                        "resume_step": result.plan.target_step,
                        "receivers": list(result.plan.receivers),
                        "sources": list(result.plan.sources),
                        "bytes": result.bytes_moved,
                        "transfer": result.plan.reason,
                        "batch_policy": self._plan.reason,
                        "lr_factor": self._plan.lr_factor,
                    },
                )
            )

    def _progress(self) -> dict[str, Any]:
        return {"step": self.step, "cursor": self.cursor, "reference_world": self._reference_world}

    def _apply_progress(self, progress: dict[str, Any]) -> None:
        self.step, self.cursor = int(progress["step"]), int(progress["cursor"])
        if progress.get("reference_world") is not None:
            self._reference_world = int(progress["reference_world"])

    def _cross_boundary(self) -> None:
        assert self._control is not None
        self.set_phase("boundary")
        self._control.send(AtBoundary(generation=self.generation, step=self.step))
        self._recover(f"membership change after step {self.step}", first=True)

    def _finish(self) -> None:
        """Leave only once every member holds the final step (a failed barrier heals the laggards first)."""
        while self._control is not None:
            try:
                done = torch.tensor([float(self.step)], dtype=torch.float64)
                if self._group:
                    self._group.allreduce_(done)
                break
            except (Interrupted, CollectiveFailed) as exc:
                self._recover(str(exc))
        if self._control:
            self.set_phase("done")
            self._control.send(Finished(generation=self.generation, step=self.step))
        if self._checkpoints:
            self._save_checkpoint()
        self.close()

    def _leave(self, reason: str) -> None:
        log.info("worker_leaving", worker=self.env.worker_id, reason=reason, step=self.step)
        self.close()
        raise SystemExit(0)

    def _stop(self, stop: Stop) -> None:
        if stop.error is None and self.rank == 0 and self._checkpoints and not self._fresh:
            self._save_checkpoint()  # a suspended job resumes from here
        self.close()
        if stop.error:
            log.error("job_stopped", worker=self.env.worker_id, reason=stop.reason)
            self._process.exit_code = 1
            raise SystemExit(1)
        raise SystemExit(0)

    # --- disaster-recovery checkpoints ---------------------------------------------------------------

    def _load_checkpoint(self) -> bool:
        if self.env.checkpoint_dir is None:
            return False
        found = load_latest(self.env.checkpoint_dir)
        if found is None:
            return False
        _, snap = found
        self._apply_progress(restore(self.model, self.optimizer, self.scheduler, snap))
        self._fresh = False
        log.info("resumed_from_checkpoint", step=self.step, directory=str(self.env.checkpoint_dir))
        return True

    def _save_checkpoint(self) -> None:
        assert self._checkpoints is not None
        snap: Snapshot = capture(self.model, self.optimizer, self.scheduler, self._progress())
        self._checkpoints.save(self.step, snap)
        self._checkpoints.wait()

    def _maybe_checkpoint(self) -> None:
        every = self.env.checkpoint_every
        if self._checkpoints and every and self.rank == 0 and self.step % every == 0:
            self._checkpoints.save(self.step, capture(self.model, self.optimizer, self.scheduler, self._progress()))

    # --- faults and failures --------------------------------------------------------------------------

    def _install_fault_hooks(self) -> None:
        faults = self._faults
        self.model.register_forward_pre_hook(lambda *_: faults.hit("forward", self.step + 1))
        if self._params:
            self._params[0].register_hook(lambda grad: faults.hit("backward", self.step + 1))
        self.optimizer.register_step_pre_hook(lambda *_: faults.hit("optimizer", self.step + 1))


__all__ = ["ElasticJob", "JobFailed"]
