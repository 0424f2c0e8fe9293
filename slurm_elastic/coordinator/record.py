"""What the job has done so far, as other threads and tools see it: the public view, the commits and their
throughput, how long each recovery took from its detection to the next commit, and what each new
generation lost or replays.

The coordinator's loop writes it; `view()` is safe from any thread (a copy taken under a lock).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from slurm_elastic.coordinator.peers import PublicView, throughput
from slurm_elastic.decide import membership as m
from slurm_elastic.events import EventLog
from slurm_elastic.eventtypes import CheckpointFallback, Commit, GenerationReady, Progress, Recovered
from slurm_elastic.wire import messages as msg

MAX_COMMIT_RECORDS = 10_000  # the newest commits kept for tools (MTTR, demos); events.jsonl has them all


class Record:
    def __init__(self, events: EventLog, *, record_commits: bool, progress_interval_s: float) -> None:
        self.events = events
        self._record_commits = record_commits
        self._progress_interval_s = progress_interval_s
        self._view = PublicView()
        self._lock = threading.Lock()
        self._recent: deque[Commit] = deque(maxlen=64)
        self._last_progress = 0.0
        self._recovering: tuple[int, float, int] | None = None  # (generation, detected at, last step)
        self._fallback_from: int | None = None  # the last committed step when a checkpoint fallback began
        self._silent_since: float | None = None  # the last word of a peer evicted for silence (monotonic)
        self.last_commit_at = time.monotonic()  # when the newest commit arrived (monotonic)

    def view(self) -> PublicView:
        with self._lock:
            v = self._view
            return PublicView(
                v.phase,
                v.generation,
                v.world,
                v.last_step,
                v.reason,
                v.failure_traceback,
                list(v.commits),
                list(v.failed_after_training),
            )

    @property
    def last_step(self) -> int:
        return self._view.last_step

    @property
    def last_commit(self) -> Commit | None:
        return self._recent[-1] if self._recent else None

    def throughput(self) -> float | None:
        return throughput(list(self._recent))

    def publish(self, state: m.State) -> None:
        gen = state.generation
        with self._lock:
            self._view.phase = state.phase
            self._view.generation = gen.number if gen else 0
            self._view.world = len(gen.ranks) if gen else 0
            self._view.reason = state.reason

    def recovery_began(self, generation: int, *, unless_begun: bool = False) -> None:
        """A recovery into `generation` was detected now: the next commit of it says how long it took."""
        if unless_begun and self._recovering is not None:
            return
        self._recovering = (generation, time.monotonic(), self._view.last_step)

    def silence_evicted(self, last_word: float) -> None:
        """A peer was evicted for silence; it last spoke at `last_word` (monotonic): the next recovery's
        commit says how long after that it came."""
        self._silent_since = last_word if self._silent_since is None else min(self._silent_since, last_word)

    def commit(self, c: msg.Committed) -> None:
        now = time.time()
        commit = Commit(c.step, c.generation, c.world, c.loss, c.time, samples=c.samples, received=now)
        self._recent.append(commit)
        self.last_commit_at = time.monotonic()
        if self._record_commits:
            self.events.record(commit, quiet=True)
        with self._lock:
            self._view.commits.append(commit)
            if len(self._view.commits) > MAX_COMMIT_RECORDS:  # a long run must not grow the coordinator
                del self._view.commits[: len(self._view.commits) - MAX_COMMIT_RECORDS]
            self._view.last_step = max(self._view.last_step, c.step)
        if self._recovering is not None and c.generation >= self._recovering[0]:
            _gen, detected, before = self._recovering
            self._recovering = None
            took = round(time.monotonic() - detected, 4)
            silent, self._silent_since = self._silent_since, None
            since_silent = round(time.monotonic() - silent, 4) if silent is not None else None
            recovered = Recovered(c.generation, c.step, took, before, silent_to_commit_s=since_silent)
            self.events.record(recovered)
        if now - self._last_progress >= self._progress_interval_s:
            self._last_progress = now
            self.events.record(Progress(c.step, round(c.loss, 4), c.world, c.generation, self.throughput()))

    def resumed_at(self, step: int) -> int:
        """A generation formed at `step` (rank 0 may have taken a step its peers committed before the fault):
        the committed steps it lost."""
        with self._lock:
            lost = max(0, self._view.last_step - step)
            self._view.last_step = max(self._view.last_step, step)
        return lost

    def fallback_began(self) -> None:
        """Every worker restarts from the last disaster-recovery checkpoint."""
        self._fallback_from = self.last_step

    def generation_ready(self, worker: str, fields: dict[str, Any]) -> None:
        """Rank 0 of a new generation reports it formed: with the committed steps lost, and after a
        checkpoint fallback the steps it replays."""
        resume = int(fields.get("resume_step", self.last_step))
        fields = {**fields, "lost_committed_steps": self.resumed_at(resume), "worker": worker}
        if self._fallback_from is not None:  # the first generation after a checkpoint fallback
            before, self._fallback_from = self._fallback_from, None
            self.events.record(CheckpointFallback(before, resume, replayed_steps=max(0, before - resume)))
        self.events.record(GenerationReady.from_event(fields))

    def failed(self, traceback: str) -> None:
        with self._lock:
            self._view.failure_traceback = traceback

    def failed_after_training(self, what: str) -> None:
        with self._lock:
            self._view.failed_after_training.append(what)
