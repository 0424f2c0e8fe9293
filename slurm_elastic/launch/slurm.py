"""`slurm-elastic run` inside a Slurm allocation (the batch script of `elastic_core.sbatch`).

The coordinator runs here, on the batch host. One agent per node starts with
`srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1`, so that losing a node's task kills neither the
step nor the job. The node list comes from Slurm itself (the environment's goes stale after a shrink or
a requeue). While the job runs, this process also turns Slurm node states into drains, keeps the pool of
pending satellite jobs that `grow --keep-pending` asked for, and on SIGTERM (the job's time is up, or
the whole job is being preempted) drains every node, has rank 0 write a disaster-recovery checkpoint
and requeues the job, which then resumes from it, possibly on a different number of nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from slurm_elastic.agent import EXIT_DRAINED_BY_SIGNAL
from slurm_elastic.agentspec import agent_launch
from slurm_elastic.commands.common import fail, job_config
from slurm_elastic.config import JobConfig, training_env
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import coordinator_config
from slurm_elastic.decide.slurm_watch import (
    agent_steps,
    back_in_service,
    drains_for,
    relaunches,
    satellites_to_submit,
)
from slurm_elastic.errors import ElasticError, SlurmError
from slurm_elastic.eventtypes import (
    AgentRelaunched,
    AgentRelaunchGivenUp,
    ControlLoopFailed,
    JobCancelled,
    SlurmJobStarted,
)
from slurm_elastic.exitmarker import fresh_core_exits, read_exit_code, read_exit_reason
from slurm_elastic.jobdir import JobHandle, LaunchInfo, hook_comment, job_dir, make_job_dir, private_dir, user_name
from slurm_elastic.logs import configure_logging, get_logger
from slurm_elastic.loops import died
from slurm_elastic.sanitize import printable_lines
from slurm_elastic.slurm import JobInfo, NodeInfo, SlurmBackend, get_backend, srun_argv
from slurm_elastic.waiting import holds_within
from slurm_elastic.wire.channel import new_secret

log = get_logger("slurm_elastic.launch")
AGENT_EXIT_S = 3.0  # from an agent's last word to its process's end, generously
SATELLITE_TEMPLATE = Path(__file__).resolve().parents[2] / "sbatch_templates" / "elastic_satellite.sbatch"


def satellite_name(core_job: str) -> str:
    return f"se-sat-{core_job}"


def satellites_of(backend: SlurmBackend, core_job: str, user: str) -> list[JobInfo]:
    """The satellite jobs of `core_job`: named after it AND submitted by its user `user` (anyone may give
    a job that name: another user's job is never counted as ours, nor cancelled)."""
    return backend.jobs(user=user, name=satellite_name(core_job))


def worker_env(config: JobConfig, directory: Path) -> dict[str, str]:
    return {
        **training_env(config),
        "SLURM_ELASTIC_CHECKPOINT_DIR": str(config.checkpoint_dir or directory / "checkpoints"),
        "SLURM_ELASTIC_CHECKPOINT_EVERY": str(config.checkpoint_every),
    }


def _advertised_host(config: JobConfig) -> str:
    if "SLURM_ELASTIC_HOST" in os.environ or config.host != "127.0.0.1":
        return config.host
    # Default inside an allocation: the batch host's own address, so agents on other nodes can reach it.
    return socket.gethostbyname(socket.gethostname())


def slurm_is_ending(info: JobInfo) -> bool:
    """Slurm itself is already ending the job (a user's `scancel`, a preemption that cancels, a node
    failure): a requeue would undo a user's cancel, and where Slurm requeues by itself (preemption with
    PreemptMode=REQUEUE) it needs no help. A job it still counts as running was stopped for a reason that
    asks to come back: the time-limit warning (`--signal`), a drain of every node."""
    return info.is_finished or "COMPLETING" in info.flags or info.state in ("COMPLETING", "CANCELLED")


class SlurmLaunch:
    relaunch_retry_s = 15.0  # between new agents on a node that came back (one may take seconds to register)

    def __init__(self, config: JobConfig, command: list[str], backend: SlurmBackend, slurm_job: str) -> None:
        self.config = config
        self.command = command
        self.backend = backend
        self.slurm_job = slurm_job
        self.dir = job_dir(slurm_job)
        self.secret = new_secret()
        self.stop_requested = threading.Event()
        self.stopped_by_user = False  # the stop is a person's Ctrl-C (SIGINT), not Slurm's warning
        self.srun: subprocess.Popen[bytes] | None = None
        self.coordinator: CoordinatorThread | None = None
        self._notified: set[str] = set()
        self._had_agent: set[str] = set()
        self._tries: dict[str, tuple[int, float]] = {}  # per node: new agents in a row, and when the last
        self._given_up: set[str] = set()
        # The newest agent started again per node, and how many agents had registered there before it.
        self._steps: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        self._retired: list[subprocess.Popen[bytes]] = []  # sruns of agents that are gone, being ended
        self._user: str | None = None  # the job's user, as Slurm names it

    def live_nodes(self) -> tuple[list[str], int]:
        """The job's nodes as Slurm sees them now, and its number of heterogeneous components (1: none)."""
        info = self.backend.job(self.slurm_job)
        if not info.het_job_id:
            return list(info.nodes), 1
        parts = [j for j in self.backend.jobs() if j.het_job_id == info.het_job_id]
        return sorted({n for j in parts for n in j.nodes}), max(1, len(parts))

    def start(self) -> None:
        cfg = self.config
        info = self.backend.job(self.slurm_job)
        nodes, components = self.live_nodes()
        host = _advertised_host(cfg)
        self._user = info.user or user_name()
        private_dir(self.dir.parent)  # the user's own directory first: only then is a name in it ours
        if info.restart_count == 0 and os.path.lexists(self.dir):
            # A fresh job whose id was used before (a reset controller): never resume an old job's state.
            stale = self.dir.with_name(f"{self.dir.name}.stale-{int(time.time())}")
            try:
                self.dir.rename(stale)
            except OSError as exc:
                raise ElasticError(f"cannot move the old {self.dir} aside to {stale.name}: {exc.strerror}") from None
            log.warning("stale_job_dir_moved", slurm_job=self.slurm_job, moved_to=str(stale))
        make_job_dir(self.dir)
        workers = len(nodes) * cfg.nproc_per_node
        settings = coordinator_config(
            cfg, job_id=self.slurm_job, secret=self.secret, job_dir=self.dir, workers=workers, host=host,
            run=info.restart_count, checkpoints=True,  # worker_env() always gives workers a checkpoint directory
        )  # fmt: skip
        self.coordinator = CoordinatorThread(settings).start()
        address = self.coordinator.address
        env = worker_env(cfg, self.dir)
        LaunchInfo(
            self.command,
            cfg.nproc_per_node,
            cfg.max_restarts,
            cfg.drain_grace_s,
            cfg.heartbeat_interval_s,
            env,
            cfg.lease_timeout_s,
        ).write(self.dir)
        JobHandle(self.slurm_job, address, self.secret, socket.gethostname(), os.getpid(), time.time()).write(self.dir)
        with contextlib.suppress(SlurmError):
            self.backend.set_comment(self.slurm_job, hook_comment(self.dir))
        self.coordinator.coordinator.events.record(SlurmJobStarted(self.slurm_job, tuple(nodes), info.restart_count))
        agent = agent_launch(
            cfg, self.command, coordinator=address, job_id=self.slurm_job, requeue_on_coordinator_loss=cfg.requeue
        ).to_argv()
        if components > 1:  # one agent per node of every component
            argv = srun_argv(agent, nodes=None, extra=(f"--het-group=0-{components - 1}", "--export=ALL"))
        else:
            argv = srun_argv(agent, nodes=len(nodes), nodelist=nodes, extra=("--export=ALL",))
        exits = fresh_core_exits(self.dir)  # a requeued run's agents report afresh
        agent_env = {"SLURM_ELASTIC_SECRET": self.secret, "SLURM_ELASTIC_EXIT_DIR": str(exits)}
        self._agent_argv, self._agent_env = agent, {**os.environ, **env, **agent_env}
        self.srun = subprocess.Popen(argv, env=self._agent_env)

    def request_stop(self, signum: int, _frame: object = None) -> None:
        """A signal to the launcher (a handler: sets flags only). SIGTERM and SIGUSR2 are Slurm's warning
        before it stops the job (preemption, the time limit): the nodes drain at a step boundary, the job
        checkpoints and is requeued. SIGINT is a person's Ctrl-C in an interactive allocation: the same
        orderly stop, checkpoint included, but nothing is requeued."""
        if signum == signal.SIGINT and not self.stop_requested.is_set():
            self.stopped_by_user = True
        self.stop_requested.set()

    # --- the loop -------------------------------------------------------------------------------------

    def supervise(self) -> str:
        assert self.coordinator is not None
        coord = self.coordinator.coordinator
        next_watch = next_pool = 0.0
        stop_by: float | None = None
        while not coord.done.wait(0.2):
            now = time.monotonic()
            if self.stop_requested.is_set() and stop_by is None:
                stop_by = now + self.config.drain_grace_s
                running = self.coordinator.call(lambda: coord.state.phase == "running")
                nodes = self.coordinator.call(lambda: sorted(coord.agents))
                if not running or not nodes:
                    log.warning("stopping_before_training", slurm_job=self.slurm_job)
                    return "suspended"  # nothing trained yet, nothing to keep: end now (requeued unless by a user)
                why = "the user stopped it (Ctrl-C)" if self.stopped_by_user else "the Slurm job is stopping (SIGTERM)"
                self.coordinator.drain(nodes, "boundary", why)
            if stop_by is not None and now > stop_by:
                log.warning("drain_timeout", slurm_job=self.slurm_job, grace_s=self.config.drain_grace_s)
                return "suspended"
            if now >= next_watch:
                next_watch = now + self.config.node_watch_interval_s
                self._watch_nodes()
            if now >= next_pool:
                next_pool = now + 2.0
                self._keep_pool()
        return self.coordinator.view().phase

    def watch(self) -> str:
        """`supervise`, but a watch loop that breaks fails the job with the reason: never a batch script gone
        with its coordinator, leaving the agents to find it silent a lease later."""
        try:
            return self.supervise()
        except Exception as exc:
            died("the launcher's watch loop", exc, self._fail)
            return "failed"

    def _fail(self, reason: str) -> None:
        assert self.coordinator is not None
        coord = self.coordinator.coordinator
        coord.events.record(ControlLoopFailed(reason, loop="launcher"))
        self.coordinator.call(coord.fail, reason)

    def _watch_nodes(self) -> None:
        """Slurm's node states become drains; nodes of the allocation that came back get an agent again."""
        assert self.coordinator is not None
        coord = self.coordinator.coordinator
        members, drained, registrations = self.coordinator.call(
            lambda: (set(coord.agents), set(coord.drained_nodes), dict(coord.agent_registrations))
        )
        self._had_agent |= members
        if not self._had_agent:
            if not registrations and (unstarted := self.agents_unstarted()):
                self._fail("; ".join(unstarted))  # a node's own setting is wrong: no agent is coming
            return  # nothing to watch before the first agents register
        try:
            allocation, _ = self.live_nodes()
            states = self.backend.nodes(sorted(set(allocation) | members)) if allocation or members else []
        except SlurmError as exc:
            log.warning("node_watch_failed", error=str(exc))
            return
        self._notified -= back_in_service(states, self._notified)
        for drain in drains_for(states, members, self._notified):
            self._notified.add(drain.node)
            self.coordinator.drain([drain.node], drain.mode, drain.reason)
        self._relaunch([n for n in states if n.name in allocation], members, drained, registrations)

    def _relaunch(
        self, ours: list[NodeInfo], members: set[str], drained: set[str], registrations: dict[str, int]
    ) -> None:
        assert self.coordinator is not None
        events = self.coordinator.coordinator.events
        alive = {n for n, (step, _) in self._steps.items() if step.poll() is None}
        registered = {n for n, (_, before) in self._steps.items() if registrations.get(n, 0) > before}
        steps = agent_steps(alive, registered, members)
        for node in steps.stale:
            log.warning("stale_agent_step_ended", node=node, slurm_job=self.slurm_job)
            step, _ = self._steps.pop(node)
            step.terminate()  # its agent is gone; Slurm ends what is left of the step
            self._retired.append(step)
        self._retired = [step for step in self._retired if step.poll() is None]
        for node in members | registered:
            self._tries.pop(node, None)  # its agent came back: a new run of tries
        now = time.monotonic()
        plan = relaunches(
            ours, had_agent=self._had_agent, have_agent=members, excluded=drained | self._notified | self._given_up,
            starting=steps.starting, tries=self._tries, now=now, retry_s=self.relaunch_retry_s,
            max_tries=self.config.max_relaunches,
        )  # fmt: skip
        for node in plan.give_up:
            self._given_up.add(node)
            reason = f"{self.config.max_relaunches} new agents in a row did not register"
            events.record(AgentRelaunchGivenUp(node, self.slurm_job, reason))
        for node in plan.start:
            attempt = self._tries.get(node, (0, now))[0] + 1
            self._tries[node] = (attempt, now)
            argv = srun_argv(self._agent_argv, nodes=1, nodelist=[node], extra=("--overlap", "--ntasks=1"))
            try:
                self._steps[node] = (subprocess.Popen(argv, env=self._agent_env), registrations.get(node, 0))
            except OSError as exc:
                log.warning("agent_relaunch_failed", node=node, error=str(exc))
                continue
            events.record(AgentRelaunched(node, self.slurm_job, attempt))

    def _keep_pool(self) -> None:
        assert self.coordinator is not None
        coord = self.coordinator.coordinator
        want = coord.pool_keep_pending
        if want <= 0:
            return
        try:
            pending = [j for j in self.satellites() if j.is_pending]
            for _ in range(satellites_to_submit(len(pending), want)):
                submit_satellite(self.backend, self.slurm_job, coord.pool_partition)
        except SlurmError as exc:
            log.warning("satellite_pool_failed", error=str(exc))

    def satellites(self) -> list[JobInfo]:
        """This job's satellite jobs (SlurmError if Slurm cannot say)."""
        if self._user is None:
            self._user = self.backend.job(self.slurm_job).user or user_name()
        return satellites_of(self.backend, self.slurm_job, self._user)

    def agents_failed(self) -> list[str]:
        """Nodes whose agent said it failed (srun's status cannot say: it counts nodes killed by a shrink)."""
        failed = []
        for marker in sorted((self.dir / "exits").glob("[!.]*")):  # not a temporary name being written
            code = read_exit_code(marker)
            if code and code != "0" and code != str(EXIT_DRAINED_BY_SIGNAL):
                failed.append(f"the agent of {marker.name} exited with {code}")
        return failed

    def agents_unstarted(self) -> list[str]:
        """Why agents could not start (a setting their node refused), from their markers."""
        exits = self.dir / "exits"
        return [reason for marker in sorted(exits.glob("[!.]*")) if (reason := read_exit_reason(marker))]

    def _agents_connected(self) -> bool:
        coordinator = self.coordinator
        if coordinator is None:
            return True  # cannot tell: let the steps take their grace
        try:
            return bool(coordinator.call(lambda: bool(coordinator.coordinator.agents)))
        except Exception:  # its loop is gone or stuck: cannot tell either, and the cleanup below must run
            return True

    def finish(self, phase: str) -> None:
        for step in self._retired:  # agents that are gone: their srun may wait for a dead node's tasks
            if step.poll() is None:
                step.terminate()
        # Every live agent, the first srun's and the relaunched ones alike, may take the grace to end on its
        # own: after its loop a script may still run collectives over every rank (an FSDP2 model's
        # `full_tensor()`), and a rank stopped early fails the others.
        # Once no agent is connected, what srun still waits for is Slurm's bookkeeping of a part of the step
        # on a node a shrink took away: it can wait for that the whole grace, so it is ended then.
        relaunched = [step for step, _ in self._steps.values()]
        steps = [*relaunched, *([self.srun] if self.srun is not None else [])]
        holds_within(
            lambda: all(step.poll() is not None for step in steps) or not self._agents_connected(),
            timeout=self.config.drain_grace_s,
            poll=0.2,
        )
        for step in relaunched:
            if step.poll() is None:
                step.terminate()
        if self.srun is not None and self.srun.poll() is None:
            # An agent that has just closed its connection is still exiting: ended by srun now, its node's
            # task would be reported killed (and slurmstepd may hang on it). Give it a moment first.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.srun.wait(timeout=AGENT_EXIT_S)
        if self.srun is not None and self.srun.poll() is None:
            self.srun.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.srun.wait(timeout=10)
            if self.srun.poll() is None:
                self.srun.kill()
        with contextlib.suppress(SlurmError):
            for job in self.satellites():
                if not job.is_finished:
                    self.backend.cancel(job.job_id)
        baseline = phase == "failed" and self.config.recovery == "requeue"
        coord = self.coordinator.coordinator if self.coordinator is not None else None
        split = coord is not None and coord.driver.requeue_after_failure
        wanted = (phase == "suspended" and not self.stopped_by_user) or baseline or split  # a person's stop stays
        if wanted and self.config.requeue:
            with contextlib.suppress(SlurmError):  # Slurm out of reach (this side was cut off): the others requeue
                info = self.backend.job(self.slurm_job)
                if slurm_is_ending(info):
                    log.info("job_not_requeued", slurm_job=self.slurm_job, state=info.state)
                elif coord is not None and info.restart_count != coord.config.run:  # the other side requeued it
                    log.info("job_not_requeued", slurm_job=self.slurm_job, restarted=info.restart_count)
                else:
                    self.backend.requeue(self.slurm_job)
                    log.info("job_requeued", slurm_job=self.slurm_job)
        if self.coordinator is not None:
            self.coordinator.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "coordinator.json").unlink()


def submit_satellite(
    backend: SlurmBackend, core_job: str, partition: str | None, env: Mapping[str, str] | None = None
) -> str:
    """One satellite job for `core_job`, submitted with `env` (default: this process's environment)."""
    if not SATELLITE_TEMPLATE.is_file():
        raise ElasticError(f"satellite template {SATELLITE_TEMPLATE} is missing")
    env = {"SE_PYTHON": sys.executable, **(env if env is not None else os.environ), "SLURM_ELASTIC_CORE_JOB": core_job}
    root = Path(env["SLURM_ELASTIC_HOME"]) if env.get("SLURM_ELASTIC_HOME") else None
    args = [f"--job-name={satellite_name(core_job)}", f"--output={job_dir(core_job, root)}/satellite-%j.out"]
    if partition:
        args.append(f"--partition={partition}")
    return backend.submit(SATELLITE_TEMPLATE, args=args, env=env)


def run_in_allocation(args: argparse.Namespace, command: list[str]) -> int:
    slurm_job = os.environ.get("SLURM_JOB_ID")
    if not slurm_job:
        return fail("`run` without --local needs a Slurm allocation (SLURM_JOB_ID is unset): submit it with sbatch")
    config = job_config(args, os.environ)
    configure_logging(config.log_format, config.log_level)
    launch = SlurmLaunch(config, command, get_backend(), slurm_job)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(sig, launch.request_stop)
    launch.start()
    phase = "failed"
    try:
        phase = launch.watch()
    finally:
        launch.finish(phase)
    view = launch.coordinator.view() if launch.coordinator else None
    if launch.stopped_by_user and phase == "suspended":
        step = view.last_step if view else 0
        if launch.coordinator is not None:
            launch.coordinator.coordinator.events.record(JobCancelled("the user (Ctrl-C)", step))
        print(f"slurm-elastic: job {slurm_job} stopped by the user (Ctrl-C) at step {step}", file=sys.stderr)
        return 130
    failed_after = (view.failed_after_training if view else []) + launch.agents_failed()
    if phase == "finished" and failed_after:
        return fail(f"job {slurm_job} finished training, but then: {'; '.join(failed_after)}", 1)
    if phase in ("finished", "suspended"):
        return 0
    if view is not None and view.failure_traceback:
        sys.stderr.write(printable_lines(view.failure_traceback))
    return fail(f"job {slurm_job} {phase}: {view.reason if view else ''}", 1)
