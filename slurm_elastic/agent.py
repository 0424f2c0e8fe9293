"""The node agent: starts this node's workers, reports each exit at once, restarts crashed ones, and
turns SIGTERM (preemption, scancel, a job shrink's polite variant) into a drain at the next step boundary.

It never imports torch: it must start fast and stay small. One agent runs per node (one srun task).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from slurm_elastic.agentspec import (
    DRAIN_GRACE_S,
    HEARTBEAT_INTERVAL_S,
    LEASE_TIMEOUT_S,
    MAX_RESTARTS,
    PROG,
    AgentLaunch,
)
from slurm_elastic.decide import agent as phase
from slurm_elastic.decide.agent import EXIT_DRAINED_BY_SIGNAL, EXIT_FAILED, AgentEvent, AgentPhase, AgentState
from slurm_elastic.decide.failures import restart_decision
from slurm_elastic.decide.health import stalled_for
from slurm_elastic.decide.worker import EXIT_COORDINATOR_LOST
from slurm_elastic.errors import ElasticError, InvalidMessage
from slurm_elastic.exitmarker import write_exit_code
from slurm_elastic.jobsecret import SECRET_FD, Secret, secret_pipe
from slurm_elastic.lineage import become_subreaper, die_with_parent, kill_adopted, reap_adopted
from slurm_elastic.logs import configure_logging, drop_unwritable_output, get_logger
from slurm_elastic.loops import start_thread
from slurm_elastic.netif import GroupInterface, route_address
from slurm_elastic.netif import for_node as group_interface_for_node
from slurm_elastic.nodecache import remove_job_cache
from slurm_elastic.probe import ProbeListener, unreachable
from slurm_elastic.rendezvous.relay import RelayThread
from slurm_elastic.waiting import holds_within
from slurm_elastic.wire.channel import Channel, answers, connect
from slurm_elastic.wire.messages import (
    Ack,
    DrainRequest,
    Heartbeat,
    HoldNode,
    KillWorker,
    Probe,
    ProbeResult,
    Pulse,
    RegisterNode,
    RestartWorkers,
    Stop,
    WorkerEvent,
    WorkerExited,
)

if TYPE_CHECKING:
    from slurm_elastic.slurm import SlurmBackend

log = get_logger("slurm_elastic.agent")
MAX_STDERR_TAIL = 4000  # characters of a worker's last stderr output, reported when it ends
REQUEUE_TRY_S = 120.0  # how long an agent that lost the coordinator tries to reach Slurm to requeue the job
PROBE_S = 10.0  # how long it then tries the coordinator, which would mean this node alone was cut off
BATCH_HOST_WATCH_S = 600.0  # how long it waits for Slurm to find the batch host unresponsive too (SlurmdTimeout)


class StderrTail:
    """Copies a worker's stderr through to ours, keeping its last few kilobytes for the report of its end."""

    def __init__(self, source: IO[bytes], sink: IO[bytes]) -> None:
        self._tail: deque[bytes] = deque(maxlen=64)
        self._thread = threading.Thread(target=self._pump, args=(source, sink), name="se-stderr", daemon=True)
        self._thread.start()

    def _pump(self, source: IO[bytes], sink: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := source.read1(65536):  # type: ignore[attr-defined]
                self._tail.append(chunk)
                with contextlib.suppress(OSError, ValueError):  # our stderr full or closed: keep draining the pipe
                    sink.write(chunk)
                    sink.flush()

    def finish(self, timeout: float = 2.0) -> str:
        """The tail once the stream ended (a grandchild may hold it open: then what we have)."""
        self._thread.join(timeout)
        return last_lines(b"".join(self._tail).decode(errors="replace"), MAX_STDERR_TAIL)


def last_lines(text: str, limit: int) -> str:
    """The end of `text`, at most `limit` characters, starting at a line's start (not in a word)."""
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    newline = cut.find("\n")
    return cut[newline + 1 :] if 0 <= newline < len(cut) - 1 else cut


__all__ = ["EXIT_DRAINED_BY_SIGNAL", "EXIT_FAILED", "Agent", "AgentConfig", "main"]


@dataclass
class AgentConfig:
    node: str
    nproc: int
    coordinator: str
    secret: str = field(repr=False)
    job_id: str
    command: list[str]
    max_restarts: int = MAX_RESTARTS
    drain_grace_s: float = DRAIN_GRACE_S
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    lease_timeout_s: float = LEASE_TIMEOUT_S  # the coordinator silent this long: it is gone
    slurm_job_id: str | None = None
    requeue_on_coordinator_loss: bool = False  # a core job's agents: losing the batch host must restart the job
    worker_env: dict[str, str] = field(default_factory=dict)
    store_relay: bool = True  # the workers' store connections end at this agent (rendezvous.relay)
    control_relay: bool = True  # and their control connections (controlrelay): one connection per node


@dataclass
class Slot:
    local_rank: int
    incarnation: int = 0
    restarts: int = 0
    proc: subprocess.Popen[bytes] | None = None
    expected_exit: bool = False  # we killed it on purpose (restart-all, eviction): not a crash
    evicted: bool = False  # the coordinator had it killed: whatever it exits with, it is not news of the coordinator
    restart_due: bool = False  # to be started again by the main thread
    restart_at: float = 0.0  # not before this time (backoff)
    stderr: StderrTail | None = None


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.slots = [Slot(i) for i in range(config.nproc)]
        self._lock = threading.Condition()  # reentrant: `_see` is called with and without it held
        self._channel: Channel | None = None
        self._state = AgentState()  # every change goes through `_see` (decide.agent)
        self._last_heard = time.monotonic()
        self._relay: RelayThread | None = None
        # The interface of this node's training groups (netif): the agent decides, its workers follow.
        self.interface: GroupInterface | None = group_interface_for_node(config.coordinator, os.environ)
        self._probes: ProbeListener | None = None

    def _see(self, event: AgentEvent) -> phase.Transition:
        with self._lock:
            transition = phase.step(self._state, event)
            self._state = transition.state
            self._lock.notify_all()
            return transition

    # --- workers --------------------------------------------------------------------------------------

    def worker_id(self, slot: Slot) -> str:
        return f"{self.config.node}:{slot.local_rank}:{slot.incarnation}"

    def _spawn(self, slot: Slot) -> None:
        cfg = self.config
        env = dict(os.environ)
        env.update(cfg.worker_env)
        env.update(self.interface.worker_env() if self.interface is not None else {})
        env.pop("SLURM_ELASTIC_SECRET", None)  # never in a worker's environment: it gets a pipe (below)
        env.update(
            {
                "SLURM_ELASTIC_COORDINATOR": cfg.coordinator,
                "SLURM_ELASTIC_JOB_ID": cfg.job_id,
                "SLURM_ELASTIC_NODE": cfg.node,
                "SLURM_ELASTIC_LOCAL_RANK": str(slot.local_rank),
                "SLURM_ELASTIC_INCARNATION": str(slot.incarnation),
                "SLURM_ELASTIC_WORKER_ID": self.worker_id(slot),
                "LOCAL_RANK": str(slot.local_rank),
            }
        )
        if self._relay is not None and cfg.store_relay:
            env["SLURM_ELASTIC_STORE"] = self._relay.address
        if self._relay is not None and cfg.control_relay:
            env["SLURM_ELASTIC_CONTROL"] = self._relay.address
        if cfg.nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: don't oversubscribe the node's cores
        slot.expected_exit = slot.restart_due = slot.evicted = False
        # Only the main thread starts workers: each dies with the thread that started it (see lineage).
        assert threading.current_thread() is threading.main_thread()
        # The secret goes in a fresh pipe per start (a restarted worker reads its own), which the worker library
        # reads and closes at `import slurm_elastic`: nothing the training code starts inherits it (jobsecret).
        secret_fd, env[SECRET_FD] = secret_pipe(cfg.secret)
        try:
            slot.proc = subprocess.Popen(
                cfg.command, env=env, stderr=subprocess.PIPE, preexec_fn=die_with_parent(), pass_fds=(secret_fd,)
            )
        except OSError as exc:  # no such program: as if it had exited at once, with the shell's code
            log.error("worker_not_started", worker=self.worker_id(slot), command=cfg.command[0], error=str(exc))
            self._ended(slot, 127, f"cannot start {cfg.command[0]!r}: {exc.strerror or exc}")
            return
        finally:
            os.close(secret_fd)  # the worker holds its own copy
        assert slot.proc.stderr is not None
        slot.stderr = StderrTail(slot.proc.stderr, sys.stderr.buffer)
        start_thread(f"se-watch-{slot.local_rank}", functools.partial(self._watch, slot, slot.proc), self._thread_died)

    def _watch(self, slot: Slot, proc: subprocess.Popen[bytes]) -> None:
        returncode = proc.wait()
        tail = slot.stderr.finish() if slot.stderr is not None else ""
        with self._lock:
            self._ended(slot, returncode, tail)

    def _ended(self, slot: Slot, returncode: int, stderr_tail: str) -> None:
        """Under the lock: one worker process ended; report it and decide on a restart."""
        wid = self.worker_id(slot)
        delay = 0.0
        if returncode == EXIT_COORDINATOR_LOST and not (slot.expected_exit or slot.evicted):
            # The worker found the coordinator silent first: the same coordinator, the same verdict (and a
            # restart would only wait for it again).
            self._see(phase.CoordinatorGone("a worker found it silent"))
        if slot.expected_exit:
            restart, reason = not self._stopping(), "restarted on request"
        else:
            decision = restart_decision(returncode, slot.restarts, self.config.max_restarts, self._stopping())
            restart, reason, delay = decision.restart, decision.reason, decision.delay_s
            slot.restarts += int(restart)
            if returncode != 0:
                self._see(phase.WorkerFailed(wid, returncode))
        tail = stderr_tail if returncode != 0 or not restart else ""
        self._report(WorkerExited(worker_id=wid, returncode=returncode, will_restart=restart, stderr_tail=tail))
        log.info("worker_exited", worker=wid, returncode=returncode, restart=restart, reason=reason)
        slot.proc = None
        if restart:
            slot.incarnation += 1
            slot.restart_due, slot.restart_at = True, time.monotonic() + delay
        self._lock.notify_all()

    def _stopping(self) -> bool:
        return phase.stopping(self._state)

    def _signal_workers(self, sig: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(sig)

    def _alive(self) -> bool:
        return any(slot.proc is not None or slot.restart_due for slot in self.slots)

    def _workers(self) -> list[int]:
        return [slot.proc.pid for slot in self.slots if slot.proc is not None]

    # --- coordinator ----------------------------------------------------------------------------------

    def _report(self, message: WorkerExited | DrainRequest | Heartbeat | WorkerEvent | ProbeResult) -> None:
        if self._channel is None or not phase.reports(self._state):
            return
        try:
            self._channel.send(message)
        except OSError:
            self._see(phase.CoordinatorGone("a send failed"))

    def _read_loop(self) -> None:
        assert self._channel is not None
        while True:
            try:
                message = self._channel.recv()
            except InvalidMessage:
                log.warning("message_dropped", node=self.config.node)
                continue  # one bad frame costs that frame, not the connection
            except (OSError, ConnectionError, ElasticError):
                self._see(phase.ConnectionClosed())
                return
            self._last_heard = time.monotonic()
            if isinstance(message, Pulse) and self._relay is not None:
                self._relay.pulse(message)  # the node's one pulse, for its relayed workers too
            with self._lock:
                if isinstance(message, KillWorker):
                    self._kill(message.worker_id, message.reason)
                elif isinstance(message, RestartWorkers):
                    log.info("restarting_workers", node=self.config.node, reason=message.reason)
                    for slot in self.slots:
                        if slot.proc is not None:
                            slot.expected_exit = True
                    self._signal_workers(signal.SIGKILL)
                elif isinstance(message, Stop):
                    self._see(phase.StopReceived(error=bool(message.error)))
                elif isinstance(message, HoldNode):
                    self._see(phase.HoldAsked(message.hold_s))
                elif isinstance(message, Probe):  # off this thread: the connects take up to its timeout
                    start_thread("se-agent-probe", functools.partial(self._probe, message), self._thread_died)

    def _probe(self, probe: Probe) -> None:
        targets = {node: address for node, address in probe.targets.items() if node != self.config.node}
        source = self._probes.address.rpartition(":")[0] if self._probes is not None else None
        failed = unreachable(targets, probe.timeout_s, source)
        if failed:
            log.warning("peers_unreachable", node=self.config.node, peers=failed[:20], count=len(failed))
        self._report(ProbeResult(round=probe.round, unreachable=failed))

    def _start_probe_listener(self) -> ProbeListener | None:
        """Where peers test their path to this node: on the training groups' address."""
        host = self.config.coordinator.rsplit(":", 1)[0].strip("[]")
        address = self.interface.address if self.interface is not None else None
        address = address or route_address(host)
        if address is None:
            return None
        try:
            return ProbeListener(address)
        except OSError as exc:  # without it, a cut to this node is found by the collectives' timeout alone
            log.warning("probe_listener_not_started", node=self.config.node, error=str(exc))
            return None

    def _kill(self, worker_id: str, reason: str) -> None:
        for slot in self.slots:
            if self.worker_id(slot) == worker_id and slot.proc is not None:
                log.warning("killing_worker", worker=worker_id, reason=reason)
                slot.expected_exit, slot.evicted = False, True
                # SIGKILL alone, also for a stopped (hung) process: a SIGCONT first would let it run on and
                # find its coordinator connection closed (the eviction closes it), exiting with that verdict.
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.kill()

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        previous = time.monotonic()
        while phase.heartbeats(self._state):
            time.sleep(interval)
            now = time.monotonic()
            self._last_heard += stalled_for(previous, now, interval)  # our own stop is not its silence
            previous = now
            if now - self._last_heard > self.config.lease_timeout_s:
                log.error("coordinator_silent", node=self.config.node, seconds=round(now - self._last_heard, 1))
                self._see(phase.CoordinatorGone("its lease ran out"))
                return
            self._report(Heartbeat(generation=0, step=-1, phase="init"))

    def _thread_died(self, reason: str) -> None:
        """A control thread ended with an exception (see loops): the agent cannot do its duty any more. It
        tells the coordinator why, then ends its workers and exits failed (`_supervise`)."""
        self._see(phase.ControlLoopDied(reason))
        self._report(WorkerEvent(kind="control_loop_failed", fields={"reason": reason}))

    def _on_signal(self, signum: int, frame: object) -> None:
        # A thread, not here: a signal handler must not wait for the lock the interrupted code may hold.
        name = signal.Signals(signum).name
        threading.Thread(target=self._drain, args=(phase.Signalled(name), name), daemon=True).start()

    def request_drain(self, reason: str) -> None:
        self._drain(phase.DrainAsked(reason), reason)

    def _drain(self, event: phase.Signalled | phase.DrainAsked, reason: str) -> None:
        if not self._see(event).report_drain:
            return  # already draining or ending
        log.info("node_draining", node=self.config.node, reason=reason)
        self._report(DrainRequest(nodes=[self.config.node], mode="boundary", reason=reason, source="agent"))

    # --- main -----------------------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        become_subreaper()  # what a worker leaves behind comes back to this agent, inside the Slurm step
        self._channel = connect(cfg.coordinator, secret=cfg.secret, job_id=cfg.job_id, role="agent", retry_s=30.0)
        self._probes = self._start_probe_listener()
        self._channel.send(
            RegisterNode(
                node=cfg.node,
                host=socket.gethostname(),
                interface=self.interface.describe() if self.interface is not None else None,
                probe=self._probes.address if self._probes is not None else None,
                nproc=cfg.nproc,
                pid=os.getpid(),
                slurm_job_id=cfg.slurm_job_id,
            )
        )
        answer = self._channel.recv(timeout=30)
        if not isinstance(answer, Ack):
            reason = answer.reason if isinstance(answer, Stop) else answer.type
            raise ElasticError(f"coordinator {cfg.coordinator} refused node {cfg.node}: {reason}")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        start_thread("se-agent-control", self._read_loop, self._thread_died)
        start_thread("se-agent-heartbeat", self._heartbeat_loop, self._thread_died)
        self._relay = self._start_relay()
        try:
            with self._lock:
                for slot in self.slots:
                    self._spawn(slot)
            return self._supervise()
        finally:
            if self._relay is not None:
                self._relay.stop()
            if self._probes is not None:
                self._probes.stop()

    def _start_relay(self) -> RelayThread | None:
        """The node's store and control relays; without them, the workers reach the coordinator themselves."""
        cfg = self.config
        if not (cfg.store_relay or cfg.control_relay):
            return None
        try:
            return RelayThread(
                cfg.coordinator, cfg.secret, cfg.job_id, control=cfg.control_relay, beat_s=cfg.heartbeat_interval_s
            ).start()
        except OSError as exc:  # no room for a Unix socket: more work for the coordinator, nothing else
            log.warning("store_relay_not_started", node=cfg.node, error=str(exc))
            return None

    def _supervise(self) -> int:
        drain_deadline: float | None = None
        with self._lock:
            while self._alive():
                if phase.ends_now(self._state):
                    break
                if phase.drain_clock_runs(self._state) and drain_deadline is None:
                    drain_deadline = time.monotonic() + self.config.drain_grace_s
                if drain_deadline is not None and time.monotonic() > drain_deadline:
                    log.warning("drain_timeout", node=self.config.node, grace_s=self.config.drain_grace_s)
                    break
                for slot in (s for s in self.slots if s.restart_due):
                    if self._stopping():
                        slot.restart_due = False
                    elif time.monotonic() >= slot.restart_at:
                        self._spawn(slot)
                reap_adopted(self._workers())
                self._lock.wait(0.2)
        self._terminate_workers()
        remove_job_cache({**os.environ, "SLURM_ELASTIC_JOB_ID": self.config.job_id})  # the workers' data copies
        code = self._exit_code()  # before closing: the reader thread takes a closed channel for a lost coordinator
        # srun's own status is unreliable once Slurm cancelled the step: tell the batch script here.
        write_exit_code(os.environ, self.config.node, code)
        self._hold_for_slurm()
        if self._channel is not None:
            self._channel.close()
        return code

    def _hold_for_slurm(self) -> None:
        """A node given back by a shrink: stay (everything already cleaned up) until Slurm ends this task.
        Slurm 22.05's slurmstepd drains a node ("Kill task failed") when a shrink's kill reaches a step part
        whose task has just exited by itself: that kill starts its unkillable-step timer after the teardown
        had stopped it, and nothing stops it again while the teardown still waits for srun. A task that is
        alive when the kill comes ends the ordinary way. Bounded: the job stopping or `hold_s` end it too."""
        with self._lock:
            hold_s = self._state.hold_s
            if hold_s is None or not phase.holds_for_slurm(self._state):
                return
            deadline = time.monotonic() + hold_s
            log.info("node_held_for_slurm", node=self.config.node, hold_s=hold_s)
            while phase.holds_for_slurm(self._state):
                if time.monotonic() >= deadline:
                    log.warning("node_hold_expired", node=self.config.node, hold_s=hold_s)
                    return
                self._lock.wait(0.2)

    def _exit_code(self) -> int:
        state = self._state
        if state.phase == AgentPhase.FAILED:
            log.error("agent_failed", node=self.config.node, reason=state.failure)
        elif state.phase == AgentPhase.COORDINATOR_LOST:
            log.error("coordinator_lost", node=self.config.node)
        elif state.phase == AgentPhase.FINISHED_BADLY:  # training finished, but the script failed afterwards
            log.error("failed_after_training", node=self.config.node, workers=list(state.failed_after_end))
        if phase.requeues_job(state, self.config.requeue_on_coordinator_loss):
            self._requeue_job()
        return phase.exit_code(state)

    def _requeue_job(self) -> None:
        """The coordinator (on the batch host) vanished without a Stop. Under `sbatch --no-kill` Slurm would
        keep the job running without its batch script, so the surviving agents requeue it; it then resumes
        from its last disaster-recovery checkpoint.

        Unless it was this node that was cut off (phase.requeue_verdict): from the coordinator, which then
        answers again (the job goes on without this node, and the launcher starts a new agent here once the
        node is back), or from the batch host alone, which Slurm then still finds responding. Slurm is asked
        first, until it answers: a node cut off from both must not requeue a healthy job with a request that
        waited out the cut."""
        job = self.config.slurm_job_id
        if not job:
            return
        from slurm_elastic.errors import SlurmError
        from slurm_elastic.slurm import get_backend

        backend, node = get_backend(), self.config.node
        deadline = time.monotonic() + REQUEUE_TRY_S
        while True:
            try:
                backend.job(job)
                break
            except SlurmError as exc:
                if time.monotonic() >= deadline:
                    log.error("requeue_impossible", node=node, slurm_job=job, detail=str(exc))
                    return
                time.sleep(1.0)
        deadline = time.monotonic() + BATCH_HOST_WATCH_S
        while (verdict := self._requeue_verdict(backend, job)) is None:
            if time.monotonic() >= deadline:
                why = f"Slurm still finds the batch host responding after {BATCH_HOST_WATCH_S:g} s: cut off here"
                verdict = phase.RequeueVerdict(False, why)
                break
            time.sleep(2.0)
        if not verdict.requeue:
            log.warning("requeue_withheld", node=node, slurm_job=job, reason=verdict.why)
            return
        try:
            backend.requeue(job)
            log.warning("job_requeued_after_coordinator_loss", slurm_job=job, node=node, reason=verdict.why)
        except SlurmError as exc:  # another agent was first, or the job is ending anyway
            log.info("requeue_not_needed", slurm_job=job, detail=str(exc))

    def _requeue_verdict(self, backend: SlurmBackend, job: str) -> phase.RequeueVerdict | None:
        from slurm_elastic.errors import SlurmError

        # A few tries: a link that has just come back may refuse the first connections (neighbours unknown).
        answers_now = holds_within(lambda: answers(self.config.coordinator), timeout=PROBE_S, poll=0.5)
        try:
            info = backend.job(job)
            running = info.state == "RUNNING" and "COMPLETING" not in info.flags
            batch = backend.nodes(info.batch_host) if info.batch_host else []
        except SlurmError:
            return None  # Slurm out of reach for now: ask again
        down = batch[0].down if batch else None
        return phase.requeue_verdict(coordinator_answers=answers_now, job_running=running, batch_host_down=down)

    def _terminate_workers(self, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        with self._lock:
            for slot in self.slots:
                slot.restart_due = False
                slot.expected_exit = slot.proc is not None  # ended by us, not a crash
            if self._alive():
                self._signal_workers(signal.SIGTERM)
            while self._alive() and time.monotonic() < deadline:
                self._lock.wait(0.1)
            self._signal_workers(signal.SIGKILL)
            while self._alive() and time.monotonic() < deadline + 5:
                self._lock.wait(0.1)
        # Orphans the workers left behind came back to this subreaper: end them (and theirs) and reap them.
        for _ in range(10):
            adopted = kill_adopted(self._workers())
            time.sleep(0.05)
            reap_adopted(self._workers())
            if not adopted:
                break
            log.warning("killed_leftover_processes", node=self.config.node, pids=adopted)


def _join_config(core_job: str, node: str, command: list[str]) -> AgentConfig:
    """A satellite agent: everything but the node name comes from the running core job's directory."""
    from slurm_elastic.jobdir import LaunchInfo, find_job, hook_comment, job_dir

    directory = job_dir(core_job)  # this user's: a satellite joins only a job of its own user
    handle, info = find_job(core_job), LaunchInfo.read(directory)
    satellite = os.environ.get("SLURM_JOB_ID")
    if satellite:
        from slurm_elastic.errors import SlurmError
        from slurm_elastic.slurm import get_backend

        try:  # lets the admin hooks on this node find the core job's coordinator
            get_backend().set_comment(satellite, hook_comment(directory))
        except SlurmError as exc:
            log.warning("set_comment_failed", slurm_job=satellite, error=str(exc))
    return AgentConfig(
        node=node,
        nproc=info.nproc_per_node,
        coordinator=handle.address,
        secret=handle.secret,
        job_id=handle.job_id,
        command=command or info.command,
        max_restarts=info.max_restarts,
        drain_grace_s=info.drain_grace_s,
        heartbeat_interval_s=info.heartbeat_interval_s,
        lease_timeout_s=info.lease_timeout_s,
        slurm_job_id=satellite,
        worker_env=info.worker_env,
    )


def main(argv: list[str] | None = None) -> int:
    args = AgentLaunch.from_argv(sys.argv[1:] if argv is None else argv)
    command = list(args.command)

    configure_logging(os.environ.get("SLURM_ELASTIC_LOG_FORMAT", "console"))  # type: ignore[arg-type]
    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    # Out of this process's environment at once (its children never inherit it); each worker gets it through
    # a pipe of its own (see _spawn).
    secret = Secret(os.environ.pop("SLURM_ELASTIC_SECRET", ""))
    try:
        if args.join:
            config = _join_config(args.join, node, command)
        else:
            if not secret:
                print(f"{PROG}: error: SLURM_ELASTIC_SECRET is required (the job's secret)", file=sys.stderr)
                return 2
            assert args.coordinator is not None and args.job_id is not None  # AgentLaunch checked them
            config = AgentConfig(
                node=node,
                nproc=args.nproc,
                coordinator=args.coordinator,
                secret=secret,
                job_id=args.job_id,
                command=command,
                max_restarts=args.max_restarts,
                drain_grace_s=args.drain_grace_s,
                heartbeat_interval_s=args.heartbeat_interval_s,
                lease_timeout_s=args.lease_timeout_s,
                slurm_job_id=os.environ.get("SLURM_JOB_ID"),
                requeue_on_coordinator_loss=args.requeue_on_coordinator_loss,
                store_relay=os.environ.get("SLURM_ELASTIC_STORE_RELAY", "1") not in ("0", "false", "no"),
                control_relay=os.environ.get("SLURM_ELASTIC_CONTROL_RELAY", "1") not in ("0", "false", "no"),
            )
        agent = Agent(config)
    except (ElasticError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        # Never registered: the launcher learns why from the marker alone, and fails the job with it
        # rather than waiting for an agent that will not come.
        write_exit_code(os.environ, node, EXIT_FAILED, reason=f"the agent of {node} could not start: {exc}")
        return EXIT_FAILED
    try:
        return agent.run()
    except (ElasticError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    try:
        code = main()
    finally:
        drop_unwritable_output()
    sys.exit(code)
