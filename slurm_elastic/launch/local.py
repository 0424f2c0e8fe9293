"""The local launcher, the embedded default: one coordinator (a thread of this process) and one agent
process per simulated node, each in its own process group so that a node can be killed as a whole.

Used by `slurm-elastic run --local`, the demo, the benchmarks and the multi-process tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from slurm_elastic.agent import EXIT_FAILED
from slurm_elastic.agentspec import agent_launch
from slurm_elastic.config import JobConfig, training_env
from slurm_elastic.coordinator import CoordinatorThread
from slurm_elastic.coordinator.config import coordinator_config
from slurm_elastic.coordinator.peers import PublicView
from slurm_elastic.errors import ElasticError
from slurm_elastic.faults import FaultPlan
from slurm_elastic.jobdir import JobHandle, LaunchInfo, job_dir, make_job_dir, new_local_job_id
from slurm_elastic.launch.localgrow import registered_nodes
from slurm_elastic.nodecache import remove_job_cache
from slurm_elastic.waiting import wait_until
from slurm_elastic.wire.channel import new_secret


@dataclass(frozen=True)
class JobResult:
    phase: str  # finished | failed | suspended | timeout | cancelled
    reason: str
    failure_traceback: str | None
    agent_exit_codes: dict[str, int | None]
    failed_after_training: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Training finished and no training process failed at its end (a node killed on the way is fine:
        the job went on without it)."""
        failed_agents = any(code == EXIT_FAILED for code in self.agent_exit_codes.values())
        return self.phase == "finished" and not self.failed_after_training and not failed_agents


class LocalJob:
    def __init__(
        self,
        command: list[str],
        config: JobConfig,
        *,
        faults: FaultPlan | None = None,
        extra_env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        root: Path | None = None,
    ) -> None:
        if not command:
            raise ElasticError("no training command given (put it after --)")
        self.command = command
        self.config = config
        self.job_id = config.job_id or new_local_job_id()
        self.dir = job_dir(self.job_id, root)
        self.secret = new_secret()
        self.faults = faults or FaultPlan()
        self.extra_env = dict(extra_env or {})
        self.log_dir = log_dir
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        self._next_node = 1
        self._cancelled: str | None = None
        self.coordinator: CoordinatorThread | None = None

    # --- life cycle -----------------------------------------------------------------------------------

    def start(self) -> LocalJob:
        cfg = self.config
        make_job_dir(self.dir)
        settings = coordinator_config(
            cfg, job_id=self.job_id, secret=self.secret, job_dir=self.dir, workers=cfg.expected_workers, host=cfg.host
        )
        self.coordinator = CoordinatorThread(settings).start()
        JobHandle(self.job_id, self.address, self.secret, "localhost", os.getpid(), time.time()).write(self.dir)
        # How to start one more node from outside (`slurm-elastic grow`, `agent --join`): no secret copied by hand.
        LaunchInfo(
            self.command, cfg.nproc_per_node, cfg.max_restarts, cfg.drain_grace_s, cfg.heartbeat_interval_s,
            self.worker_env(), launcher="local", cwd=os.getcwd(),
        ).write(self.dir)  # fmt: skip
        for _ in range(cfg.nodes):
            self.add_node()
        return self

    @property
    def address(self) -> str:
        assert self.coordinator is not None
        return self.coordinator.address

    def add_node(self, name: str | None = None) -> str:
        """Start one more simulated node (an agent with its workers); it joins at a step boundary."""
        if name is None:
            used = set(registered_nodes(self.dir))  # nodes `slurm-elastic grow` added are never named again
            while f"local{self._next_node}" in self.agents or f"local{self._next_node}" in used:
                self._next_node += 1
            name = f"local{self._next_node}"
        cfg = self.config
        env = {
            **os.environ,
            **self.worker_env(),
            "SLURM_ELASTIC_SECRET": self.secret,
        }
        argv = agent_launch(cfg, self.command, coordinator=self.address, job_id=self.job_id, node=name).to_argv()
        out: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
            self._logs.append(out)
        self.agents[name] = subprocess.Popen(
            argv, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT if out else None
        )
        return name

    def worker_env(self) -> dict[str, str]:
        """What every node's workers get in their environment (the secret apart)."""
        cfg = self.config
        env = {
            **training_env(cfg),
            **self.faults.to_env(),
            **self.extra_env,
            "OMP_NUM_THREADS": self.extra_env.get("OMP_NUM_THREADS", "1"),
        }
        if cfg.checkpoint_dir:
            env["SLURM_ELASTIC_CHECKPOINT_DIR"] = str(cfg.checkpoint_dir)
            env["SLURM_ELASTIC_CHECKPOINT_EVERY"] = str(cfg.checkpoint_every)
        return env

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> float:
        """Signal a whole simulated node (agent and workers); returns the wall-clock time of the kill."""
        proc = self.agents[name]
        when = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        return when

    def view(self) -> PublicView:
        assert self.coordinator is not None
        return self.coordinator.view()

    def wait_until(self, predicate: Callable[[PublicView], bool], timeout: float, poll: float = 0.02) -> PublicView:

        def reached() -> PublicView | None:
            view = self.view()
            return view if predicate(view) else None

        return wait_until(
            reached,
            timeout=timeout,
            what=f"a condition of job {self.job_id}",
            poll=poll,
            give_up=lambda: self.ended(),
        )

    def ended(self) -> str | None:
        """Why nothing more will happen in this job (its phase and reason), or None while it runs."""
        view = self.view()
        return f"phase {view.phase}: {view.reason}" if view.phase in ("failed", "finished", "suspended") else None

    def wait(self, timeout: float | None = None, agents_timeout: float | None = 30.0) -> JobResult:
        """Wait for the job's end (or `cancel()`), then up to `agents_timeout` for the nodes' agents to exit."""
        assert self.coordinator is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        done = False
        while not done and self._cancelled is None:
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0:
                break
            done = self.coordinator.coordinator.done.wait(left)
        view = self.view()
        if self._cancelled is not None:
            codes = {name: proc.poll() for name, proc in self.agents.items()}
            return JobResult("cancelled", self._cancelled, None, codes)
        end = None if agents_timeout is None else time.monotonic() + agents_timeout
        for proc in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=None if end is None else max(0.1, end - time.monotonic()))
        phase = view.phase if done else "timeout"
        codes = {name: proc.poll() for name, proc in self.agents.items()}
        return JobResult(phase, view.reason, view.failure_traceback, codes, tuple(view.failed_after_training))

    def cancel(self, reason: str) -> None:
        """Make `wait()` return at once (safe from a signal handler); `stop()` then ends everything."""
        self._cancelled = reason

    def stop(self) -> None:
        if self._cancelled is not None and self.coordinator is not None:  # before its processes are ended
            with contextlib.suppress(Exception):  # a stop by the user waits seconds at most, whatever the loop does
                self.coordinator.call(self.coordinator.coordinator.cancel, f"stopped by {self._cancelled}", timeout=5)
        for proc in self.agents.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.coordinator is not None:
            self.coordinator.stop()
        remove_job_cache({**os.environ, "SLURM_ELASTIC_JOB_ID": self.job_id})  # agents killed above left it
        for fh in self._logs:
            fh.close()
        if self.coordinator is not None:  # only then was the job's directory found to be ours
            with contextlib.suppress(FileNotFoundError):
                (self.dir / "coordinator.json").unlink()

    def __enter__(self) -> LocalJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
