"""`ElasticJob`: the worker library that turns a data-parallel training loop into an elastic one.

    job = ElasticJob(model, optimizer, scheduler, dataset=data, global_batch=64, micro_batch=8)
    for epoch in job.epochs(10):                 # or: for x, y in job.micro_batches(total_steps):
        for x, y in job.micro_batches():
            job.backward(loss_fn(model(x), y))
        evaluate_and_log(epoch)                  # per-epoch code; job.on_step / job.on_epoch hooks too

The first use of `job.rank`, `job.world_size`, `job.epoch`, ... joins the job (so does the loop). A job
runs one loop, to its end or to a step boundary where every rank leaves it (a `break` that all ranks take at
the same step, or `job.stop()` from any one rank); `usage.py` says what is refused and why. The job is
complete once every member's loop ended at the same step; the code after the loop then runs with the group
still formed. The user's own state
(`extra_state=`) travels with the replica's; `job.save(path)` / `resume_from=` are the script's snapshots.

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

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from slurm_elastic.data.order import SampleOrder
from slurm_elastic.decide import worker as decide
from slurm_elastic.decide.batching import LrRule
from slurm_elastic.decide.epochs import Goal, epoch_end, epoch_of, positive_int
from slurm_elastic.errors import JobFailed, UsageError
from slurm_elastic.logs import get_logger
from slurm_elastic.wire.messages import AtBoundary, Finished, LoopOpened, StopAsked
from slurm_elastic.worker.callbacks import Callbacks, EpochHook, StepHook
from slurm_elastic.worker.checkpoints import userstate
from slurm_elastic.worker.choose import choose_strategy
from slurm_elastic.worker.env import WorkerEnv, worker_env
from slurm_elastic.worker.input.data import ElasticLoader, Samples
from slurm_elastic.worker.input.loadpool import LoadPool
from slurm_elastic.worker.input.prefetch import Prefetcher
from slurm_elastic.worker.input.sampled import SAMPLED_STREAM, BatchFn, SampledBatches
from slurm_elastic.worker.lossscale import LossScaling
from slurm_elastic.worker.membership.comm import Interrupt
from slurm_elastic.worker.membership.runtime import Runtime, WorkerEnded
from slurm_elastic.worker.optguard import guard_optimizer
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.ports import Ports
from slurm_elastic.worker.process import ProcessHooks
from slurm_elastic.worker.settings import JobSettings
from slurm_elastic.worker.step import Step
from slurm_elastic.worker.stepper import Stepper
from slurm_elastic.worker.strategy import Held
from slurm_elastic.worker.usage import (
    LoopName,
    LoopState,
    backward_outside,
    left_by_statement,
    left_early,
    left_early_signature,
    save_during_step,
)

log = get_logger("slurm_elastic.worker")


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
        dataset: Samples | None = None,
        batch_fn: BatchFn | None = None,
        micro_batch: int | None = None,
        global_batch: int | None = None,
        per_replica_batch: int | None = None,
        lr_rule: LrRule = "linear",
        reference_world: int | None = None,
        seed: int = 0,
        loader: Any | None = None,
        shuffle: bool | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        clip_grad_norm: float | None = None,
        scaler: torch.amp.GradScaler | None = None,
        reduce_dtype: str | None = None,
        bucket_mb: float | None = None,
        prefetch: int | None = None,
        extra_state: dict[str, Any] | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        start_step: int | None = None,
        keep_checkpoints: int | None = None,
        env: WorkerEnv | None = None,
        ports: Ports | None = None,
    ) -> None:
        self.env = env or worker_env()
        self._settings = settings = JobSettings.of(
            self.env, dataset=dataset, loader=loader, micro_batch=micro_batch, global_batch=global_batch,
            per_replica_batch=per_replica_batch, lr_rule=lr_rule, reference_world=reference_world, seed=seed,
            shuffle=shuffle, collate_fn=collate_fn, num_workers=num_workers, pin_memory=pin_memory,
            clip_grad_norm=clip_grad_norm, reduce_dtype=reduce_dtype, bucket_mb=bucket_mb, prefetch=prefetch,
            resume_from=resume_from, keep_checkpoints=keep_checkpoints, batch_fn=batch_fn, start_step=start_step,
        )  # fmt: skip
        data = settings.data
        self.seed = seed
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.extra_state: dict[str, Any] = userstate.validate(extra_state)  # the caller's dict, kept as is
        self._phases = PhaseHooks()  # where tests and chaos act (worker.phases): nothing attached unless armed
        self._interrupt = Interrupt()
        self._ports = ports = ports or Ports()
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device if params else torch.device("cpu")
        self._runtime = Runtime(self.env, ports, self._phases, self._interrupt, device)
        self._usage = LoopState()
        self._ignored: set[str] = set()
        in_loop = lambda: self._usage.phase == "running"  # noqa: E731
        scaling = LossScaling(scaler, in_loop, self._ignored_call) if scaler is not None else None
        # A fully_shard (FSDP2) model: shards held twice, re-sharded from peers (docs/fsdp.md); else replicas.
        self._strategy = strategy = choose_strategy(
            model, optimizer, scheduler, self.extra_state, settings, scaling,
            phases=self._phases, change_requested=self._runtime.change_requested, report=self._runtime.report,
        )  # fmt: skip
        self._held: Held = strategy.held
        self._held.reference_world = reference_world
        self._order = SampleOrder(data.num_samples, seed, shuffle=data.shuffle)
        self._load_batch = (
            SampledBatches(data.batch_fn, seed, data.micro_batch) if data.batch_fn is not None else self._load_samples
        )
        if isinstance(loader, ElasticLoader):
            loader.bind(self)  # (every argument is checked before the loader processes start)
        pool = None
        if data.num_workers:  # forked now, before any process group or control thread exists
            pool = LoadPool(self._load_batch, data.num_workers, seed=seed, worker_init=data.worker_init)
        prefetcher = Prefetcher(
            self._load_batch, settings.prefetch, pin_memory=data.pin_memory and device.type == "cuda", pool=pool
        )
        ckpt = self.env.checkpoint_dir
        checkpoints = (
            strategy.checkpoints(
                ckpt, self.env.checkpoint_every, self.env.checkpoint_background, self._runtime.report,
                settings.keep_checkpoints,
            ) if ckpt else None
        )  # fmt: skip
        self._runtime.checkpoints = checkpoints is not None
        self._runtime.every_rank_saves = strategy.every_rank_saves
        self._goal: Goal | None = None  # where the loop ends (bounds how far batches are read ahead)
        self._loop: dict[str, int | float | str | bool | None] | None = None  # what every member's loop must match
        self._stop_asked = False  # job.stop() here, with no coordinator to carry it
        self._hooks = Callbacks(data.num_samples)
        self._stepper = Stepper(settings, self._runtime, strategy, prefetcher, checkpoints, self._phases,
                                self._usage, self._hooks)  # fmt: skip
        self._attempt: Step | None = None  # the step whose micro-batches job.backward() serves
        self._process = ProcessHooks(self.env.node, self.env.worker_id, self._runtime.send, enabled=ports.process_hooks)
        self._started = False
        self._held.step_fn = guard_optimizer(optimizer, in_loop, self._ignored_call)
        self._arm_faults(ports)

    # --- where this replica stands (the first use joins the job) -------------------------------------

    @property
    def rank(self) -> int:
        self._join()
        return self._runtime.rank

    @property
    def world_size(self) -> int:
        self._join()
        return self._runtime.world

    @property
    def generation(self) -> int:
        self._join()
        return self._runtime.generation

    @property
    def step(self) -> int:
        """Committed optimizer steps (of the whole run, resumed ones included)."""
        self._join()
        return self._held.step

    @property
    def cursor(self) -> int:
        """Committed position in the global sample stream."""
        self._join()
        return self._held.cursor

    @property
    def epoch(self) -> int:
        """The epoch the next sample belongs to: cursor // len(dataset), the same on every rank."""
        self._join()
        return epoch_of(self._held.cursor, self._order.num_samples)

    @property
    def global_batch(self) -> int:
        """The samples of one optimizer step over all ranks (fixed for the job's life unless
        `per_replica_batch=` lets it follow the world size)."""
        self._join()
        return self._stepper.plan.step_samples

    @property
    def loss(self) -> float | None:
        """The last committed step's mean loss over its whole global batch (the same on every rank)."""
        return self._stepper.loss

    @property
    def reduce_dtype(self) -> str:
        return self._strategy.reduce_dtype

    # --- the training loop ----------------------------------------------------------------------------

    def steps(self, total_steps: int) -> Iterator[Step]:
        """Yield step attempts until `total_steps` optimizer steps of the whole run are committed."""
        self._open("steps", Goal(steps=positive_int("total_steps", total_steps)), total_steps=total_steps)
        return self._guarded("steps", self._attempts(final=True))

    def micro_batches(self, total_steps: int | None = None) -> Iterator[Any]:
        """This rank's micro-batches, step after step, until `total_steps` optimizer steps of the whole run are
        committed; call `backward(loss)` on each. Without `total_steps`, inside `job.epochs()`: this epoch's;
        with `batch_fn=` and no epochs: until the loop is left (a `break` at a step boundary, `job.stop()`)."""
        if total_steps is None and self._settings.data.batch_fn is not None:
            self._open("micro_batches", Goal(samples=SAMPLED_STREAM))
            return self._guarded("micro_batches", self._flat(None, final=True))
        if total_steps is None:
            epoch = self._usage.epoch_batches_start()
            goal = Goal(samples=epoch_end(epoch, self._order.num_samples))
            return self._guarded("micro_batches", self._flat(goal, final=False))
        self._open("micro_batches", Goal(steps=positive_int("total_steps", total_steps)), total_steps=total_steps)
        return self._guarded("micro_batches", self._flat(None, final=True))

    def epochs(self, total_epochs: int) -> Iterator[int]:
        """Yield the epoch numbers from the job's current epoch (0, or where a resumed job stands) up to
        `total_epochs - 1`; iterate `job.micro_batches()` once inside each."""
        total = positive_int("total_epochs", total_epochs)
        if self._settings.data.batch_fn is not None:
            raise UsageError(
                "job.epochs() needs a data set: with batch_fn= there are no epochs; loop over "
                "job.micro_batches(total_steps), job.steps(total_steps), or job.micro_batches() until you leave it"
            )
        self._open("epochs", Goal(samples=total * self._order.num_samples), total_epochs=total)
        return self._guarded("epochs", self._epoch_loop(total))

    def backward(self, loss: torch.Tensor) -> None:
        if self._attempt is None:
            raise backward_outside()
        self._attempt.backward(loss)

    def stop(self, reason: str = "job.stop()") -> None:
        """End the loop on every rank at the next step boundary: for a decision one rank makes (a time budget,
        an early stop on a metric it computes). The loop then returns on every rank and the code after it
        runs; a step already running completes first."""
        self._join()
        if self._runtime.standalone:
            self._stop_asked = True
        else:
            self._runtime.send(StopAsked(reason=str(reason)[:300]))

    def on_step(self, fn: StepHook) -> StepHook:
        """Run `fn(step, loss)` on this rank after each step it commits (usable as a decorator)."""
        self._hooks.on_step(fn)
        return fn

    def on_epoch(self, fn: EpochHook) -> EpochHook:
        """Run `fn(epoch)` on this rank once `epoch` has ended (usable as a decorator)."""
        self._hooks.on_epoch(fn)
        return fn

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the job's whole state (model, optimizer, scheduler, RNG, cursor, extra_state) to `path`;
        `ElasticJob(..., resume_from=path)` starts from it. Call it between steps (before a step's first
        backward counts: nothing of that step is applied yet): on one rank (a file), or on every rank for a
        `fully_shard` model (a directory of shards, docs/fsdp.md)."""
        self._join()
        live = self._stepper.live
        if live is not None and live.backwarded:
            raise save_during_step(live.number)
        self._strategy.save(Path(path))
        log.info("snapshot_saved", path=str(path), step=self._held.step)
        return Path(path)

    def micro_batches_per_epoch(self) -> int:
        """This rank's micro-batches in one epoch at the current world size (`len(loader)`)."""
        self._join()
        plan = self._stepper.plan
        steps = -(-self._order.num_samples // plan.step_samples)
        return steps * len(self._stepper.mine())

    def interrupted(self) -> bool:
        return self._interrupt.is_set()

    def close(self) -> None:
        self._stepper.prefetch.close()
        if self._stepper.checkpoints:
            self._stepper.checkpoints.close()
        self._stepper.close_ledger()
        self._runtime.close()

    # --- how the loops run ----------------------------------------------------------------------------

    def _ignored_call(self, name: str) -> None:
        if name not in self._ignored:
            self._ignored.add(name)
            log.info("optimizer_call_ignored", call=f"{name}()", why="the job steps once per global batch")

    def _load_samples(self, start: int, size: int) -> Any:
        """The samples at stream positions [start, start + size), collated (run by the prefetcher or its pool)."""
        data = self._settings.data
        assert data.dataset is not None
        return data.collate([data.dataset[int(i)] for i in self._order.indices(start, size)])

    def _join(self) -> None:
        self._usage.usable()
        if not self._started:
            try:
                self._start()
            except WorkerEnded as ended:
                self._end(ended.ending)

    def _open(self, name: LoopName, goal: Goal, **length: int) -> None:
        self._usage.open(name, self._held.step)
        self._goal = goal
        s = self._settings
        self._loop = {
            **length,
            "global_batch": s.global_batch,
            "per_replica_batch": s.per_replica_batch,
            "micro_batch": s.data.micro_batch,
            "seed": s.seed,
            "dataset_size": self._order.num_samples,
            "shuffle": s.data.shuffle,
        }
        if self._started:
            self._stepper.prefetch.plan(self._schedule())  # joined before the loop: now the loop's length is known
            self._report_loop()

    def _report_loop(self) -> None:
        """Every member's loop must be the same: the coordinator compares them, and fails the job at once,
        naming both sides, where they differ (else the ranks would wait for each other at different steps)."""
        if self._loop is not None and not self._runtime.standalone:
            self._runtime.send(LoopOpened(settings=self._loop))

    def _guarded(self, name: LoopName, inner: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from inner
        except GeneratorExit:
            self._left_early(name, sys._getframe(1))  # the script's frame, which dropped the loop
            raise

    def _left_early(self, name: LoopName, dropped_by: Any) -> None:
        """The script dropped a loop before its end. At a step boundary, by a `break` or a `return`: the loop
        ends there (`_leave_loop`). Inside a step, or by an exception: this rank cannot take part in the step
        any more, and that is an error."""
        if self._usage.phase != "running" or sys.is_finalizing():
            return
        if left_by_statement(dropped_by):
            try:
                at = self._boundary_left()
                if at is not None:
                    self._finish(f"job.{name}() left at step {at}")
                    return
            except WorkerEnded as ended:  # it cannot be raised here: the script goes on after its loop
                self._ending(ended.ending)
                self._process.exit_at_end(ended.ending.code)
                return
        step = self._held.step + 1
        error = left_early(name, step)
        self._usage.broke(error)
        log.error("loop_left_early", worker=self.env.worker_id, step=step, error=str(error))

        def leave() -> None:
            self._strategy.abandon()
            self._runtime.abandon()
            self.close()

        self._process.report_later(error, left_early_signature(name), then=leave)

    def _boundary_left(self) -> int | None:
        """The committed step a dropped loop left at, or None where it left inside a step. A step whose every
        micro-batch was back-propagated is committed first; one with none back-propagated is dropped."""
        attempt = self._stepper.live
        if attempt is None:
            return self._held.step
        if attempt.backwarded == 0 and not attempt.complete:
            self._stepper.live = None
            self._strategy.abandon()
            return self._held.step
        if not attempt.all_backwarded:
            return None
        attempt.complete = not attempt.aborted
        outcome, _ = self._stepper.conclude(attempt)
        if outcome != "committed":  # a peer may have committed it: heal from it, or the step is lost to the loop
            self._recover(patient=False)
        return self._held.step if self._held.step >= attempt.number else None

    def _flat(self, goal: Goal | None, *, final: bool) -> Iterator[Any]:
        for attempt in self._attempts(goal, final=final):
            self._attempt = attempt
            yield from attempt.micro_batches()
        self._attempt = None

    def _epoch_loop(self, total: int) -> Iterator[int]:
        self._join()
        n = self._order.num_samples
        while (epoch := epoch_of(self._held.cursor, n)) < total:
            self._usage.enter_epoch(epoch)
            yield epoch
            if self._usage.phase == "finished":  # the epoch's loop was left at a boundary, or job.stop()
                return
            self._usage.leave_epoch(epoch, ended=self._held.cursor >= epoch_end(epoch, n))
        for _ in self._attempts(final=True):  # recover if needed, then the job's final barrier
            raise RuntimeError("slurm-elastic: a step is left after the last epoch ended")

    def _attempts(self, goal: Goal | None = None, *, final: bool) -> Iterator[Step]:
        """Step attempts until `goal` (default: the loop's) is reached; `final`: then finish the job."""
        try:
            self._start()
            until = goal or self._goal
            assert until is not None
            outcome: decide.AttemptOutcome = "none"
            detail = ""
            while True:
                situation = decide.Situation(
                    self._held.step, until.steps, outcome, self._runtime.superseded(), self._stepper.boundary_due,
                    detail, cursor=self._held.cursor, cursor_goal=until.samples, stop_asked=self._stop_asked,
                )  # fmt: skip
                outcome, detail = "none", ""
                match decide.next_move(situation):
                    case decide.RunStep():
                        attempt = self._stepper.new_attempt()
                        yield attempt
                        outcome, detail = self._stepper.conclude(attempt)
                    case decide.Recover(patient=patient):
                        self._recover(patient=patient)
                    case decide.CrossBoundary():
                        self._cross_boundary()
                    case decide.Finish(reason=reason):
                        if final or self._stop_asked:
                            self._finish(reason)
                        return
        except WorkerEnded as ended:
            if ended.ending.kind == "complete":  # job.stop(): every member's loop ends at this boundary
                self._completed()
                return
            self._end(ended.ending)

    # --- generations ----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        env = self.env
        if env.standalone:
            self._stepper.open_ledger(env.ledger_dir, env.worker_id, env.run)
            self._load_initial_state()
            self._strategy.start_alone(self._runtime.solo(), env.worker_id)
            self._held.fresh = False
            self._entered()
            self._hooks.settled(self._held.cursor)
            return
        settings = self._runtime.register(-1)
        self._report_loop()
        self._stepper.open_ledger(env.ledger_dir, env.worker_id, settings.run)
        if settings.load_checkpoint:  # the job (re)starts; a joiner's state is never on disk
            self._load_initial_state()
        if self._ports.process_hooks:
            self._process.install()
        self._recover(patient=True)

    def _load_initial_state(self) -> None:
        """The job's own latest disaster-recovery checkpoint, else the user's `resume_from` snapshot if it exists,
        else what the script loaded itself, at `start_step` (docs/api.md: the script's own checkpoints)."""
        checkpoints, path, start = self._stepper.checkpoints, self._settings.resume_from, self._settings.start_step
        if checkpoints and checkpoints.load_into(self._held):
            loaded = "the job's checkpoint"
        elif path is not None and path.exists():
            self._strategy.resume(path)
            loaded = f"the snapshot {path}"
        else:
            if path is not None:
                log.info("no_snapshot_to_resume", path=str(path))  # a first run: it starts fresh
            if start is not None and self._settings.global_batch is not None:
                self._held.step, self._held.cursor = start, start * self._settings.global_batch
            return
        if start is not None:
            log.info("start_step_superseded", start_step=start, step=self._held.step, by=loaded)

    def _recover(self, *, patient: bool, keep_group: bool = False) -> None:
        self._strategy.abandon()
        entered = self._runtime.recover(self._strategy, patient=patient, keep_group=keep_group)
        self._entered()
        self._hooks.settled(self._held.cursor)  # a rank healed past an epoch's end runs its hooks
        self._runtime.report_generation(entered, self._stepper.generation_fields())

    def _entered(self) -> None:
        """A generation is formed: plan its steps and the batches this rank will read."""
        if self._held.reference_world is None:
            self._held.reference_world = self._runtime.world
        asked = self._settings.global_batch is not None or self._settings.per_replica_batch is not None
        if not asked and self._held.global_batch is None:  # DDP's per-rank batch x world, kept
            self._held.global_batch = self._settings.data.micro_batch * self._runtime.world
        self._stepper.replan()
        self._stepper.prefetch.plan(self._schedule())

    def _schedule(self) -> Iterator[tuple[int, int]]:
        plan, cursor, goal = self._stepper.plan, self._held.cursor, self._goal
        if goal is None:  # joined before the loop started: planned again when it does
            return
        mine = self._stepper.mine()
        for k in range(goal.steps_left(self._held.step, cursor, plan.step_samples)):
            base = cursor + k * plan.step_samples
            for mb in mine:
                yield base + mb.offset, mb.size

    def _cross_boundary(self) -> None:
        self._stepper.set_phase("boundary")
        self._runtime.send(AtBoundary(generation=self._runtime.generation, step=self._held.step))
        self._recover(patient=True, keep_group=True)

    def _finish(self, how: str) -> None:
        """This rank's loop ended at its committed step: tell the coordinator, and wait until every member's
        loop ended at that step (the job is then complete). A member lost or behind meanwhile brings a new
        generation, where this rank heals it and reports again; members that disagree fail the job."""
        try:
            while not self._runtime.standalone:
                self._stepper.set_phase("done")
                self._runtime.send(Finished(generation=self._runtime.generation, step=self._held.step, how=how))
                self._recover(patient=True, keep_group=True)
        except WorkerEnded as ended:
            if ended.ending.kind != "complete":
                raise
        self._completed()

    def _completed(self) -> None:
        """The job is complete: the loop returns, and the group stays formed for the script's code after it."""
        self._stepper.set_phase("done")
        self._usage.finish(self._held.step)
        if self._stepper.checkpoints:
            self._stepper.checkpoints.save_now(self._held)
        self.close()

    def _ending(self, ending: decide.Ending) -> None:
        """What every ending does before the process goes: a suspended job's checkpoint, the log, the close."""
        if ending.save_checkpoint and self._stepper.checkpoints:
            self._stepper.checkpoints.save_now(self._held)  # a suspended job resumes from here
        log_at = log.error if ending.code else log.info
        step = self._held.step
        log_at("worker_ending", worker=self.env.worker_id, kind=ending.kind, reason=ending.reason, step=step)
        self._usage.end(ending.kind)
        self.close()

    def _end(self, ending: decide.Ending) -> NoReturn:
        """The one way a worker's process ends (see the module's docstring)."""
        self._ending(ending)
        self._process.exit_code = ending.code
        raise JobEnded(ending)

    # --- faults ---------------------------------------------------------------------------------------

    def _arm_faults(self, ports: Ports) -> None:
        """A test's faults (ports), or the plan in this worker's environment where it names this worker. The
        fault code is imported only then: an unarmed job runs none of it, and has no hooks in its model."""
        arm = ports.faults
        env = self.env
        if arm is None and any(f.node == env.node for f in env.faults.faults):
            from slurm_elastic.testing.injector import FaultInjector

            arm = FaultInjector(env.faults, env.node, env.local_rank, env.incarnation).attach
        if arm is None:
            return
        arm(self._phases, self._held)
        phases, replica = self._phases, self._held
        if phases.attached("forward"):
            self.model.register_forward_pre_hook(lambda *_: phases.fire("forward", replica.step + 1))
        if phases.attached("backward"):
            self._strategy.hook_backward_phase()
        if phases.attached("optimizer"):
            self.optimizer.register_step_pre_hook(lambda *_: phases.fire("optimizer", replica.step + 1))


__all__ = ["ElasticJob", "JobEnded", "JobFailed", "Samples", "UsageError"]
