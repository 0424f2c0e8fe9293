"""What the coordinator learns of its workers' scripts: their exceptions, the loops they ask for, and the
processes that ended before the job ran. Each report may carry a verdict that ends the job (the same
failure too often, a misuse, loops that differ, a command that cannot start); the coordinator acts on it."""

from __future__ import annotations

from collections.abc import Mapping

from slurm_elastic.decide.failures import ExitRecord, identical_failure_verdict, never_joined_verdict, record_failure
from slurm_elastic.decide.loops import LoopSettings, loop_difference
from slurm_elastic.wire import messages as msg

MAX_TRACEBACKS = 100


class ScriptReports:
    def __init__(self, max_identical_failures: int) -> None:
        self.max_identical_failures = max_identical_failures
        self.failures: dict[str, int] = {}  # by signature: how often it happened
        self.tracebacks: dict[str, str] = {}  # by signature, the first MAX_TRACEBACKS signatures
        self.last_traceback: str | None = None  # since the last generation formed: shown if the job then fails
        self._raised: dict[str, str] = {}  # a worker's reported failure, until its loss names it as the cause
        self.early_exits: list[ExitRecord] = []  # processes that ended before the job ran
        self._first_loop: tuple[str, LoopSettings] | None = None  # every worker's loop must be this one
        self._registered: set[str] = set()  # workers that registered since the last generation formed

    def failed(self, f: msg.Failure) -> str | None:
        """Record a worker's exception; the reason to end the job, if it must end."""
        self._raised[f.worker_id] = f.signature
        self.failures = record_failure(self.failures, f.signature)
        if f.signature in self.tracebacks or len(self.tracebacks) < MAX_TRACEBACKS:
            self.tracebacks[f.signature] = f.traceback
        self.last_traceback = f.traceback
        if f.fatal:  # no restart can mend a misuse of the job: the same script misuses it again
            return f"the training script misused the job on {f.worker_id}: {f.signature}"
        return identical_failure_verdict(self.failures, self.max_identical_failures)

    def cause_of_loss(self, wid: str, cause: str) -> str:
        """Why `wid` is gone, by its own report where it made one: its script raised."""
        raised = self._raised.pop(wid, None)
        return f"the script of {wid} raised {raised[:300]}" if raised is not None else cause

    def registered(self, wid: str) -> None:
        self._registered.add(wid)

    def joined(self, wid: str) -> bool:
        """Whether `wid` registered since the last generation formed (an exit before that is a wrong command)."""
        return wid in self._registered

    def exited_early(self, exit_: ExitRecord, expected_per_node: Mapping[str, int], alive: int) -> str | None:
        """A training process ended before the job ran; the reason to end the job, if no process can join."""
        self.early_exits.append(exit_)
        return never_joined_verdict(expected_per_node, self.early_exits, alive)

    def first_words(self) -> str | None:
        """The first early exit's stderr, whole: what the person who started the job must read."""
        return next((x.stderr_tail for x in self.early_exits if x.stderr_tail), None)

    def loop_opened(self, wid: str, settings: LoopSettings) -> str | None:
        """The first worker's loop is the job's; the reason to end the job where `wid`'s differs."""
        if self._first_loop is None:
            self._first_loop = (wid, settings)
            return None
        return loop_difference(*self._first_loop, wid, settings)

    def generation_formed(self) -> None:
        """The job runs: exits and failures before now are behind it."""
        self.early_exits.clear()
        self._registered.clear()
        self.last_traceback = None

    def scripts_restarted(self) -> None:
        """Every worker starts its script again: its loop is asked again."""
        self._first_loop = None

    def pending_causes(self) -> int:
        return len(self._raised)

    def registrations(self) -> int:
        return len(self._registered)


__all__ = ["MAX_TRACEBACKS", "ScriptReports"]
