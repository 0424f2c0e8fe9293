"""Membership by generations: a pure reducer `decide(state, event, now, policy) -> Outcome`.

The coordinator feeds it events (a worker registered, workers were lost, nodes must drain, a worker
reached a step boundary, a worker finished, time passed) and carries out the actions it returns. It never
sleeps, reads a clock or touches a socket, so every path is tested without processes.

A job ends when every member's training loop has ended at the same committed step (`Done`); a member
whose loop ended keeps its place, heals peers in any later generation and reports again, so the end waits
for whoever is behind; no one joins meanwhile (a joiner would run on past that step). Members that end at
different steps, or one that goes on past another's end (`WentOn`), fail the job with both sides named:
their loops disagree, and waiting would hang.

Two kinds of change:
- abrupt (a member was lost): generation g+1 starts at once; survivors abort the step in flight and
  re-run it, so the change costs no committed step;
- graceful (joiners, drains): members are asked to stop at the next step boundary; the first worker
  that reports the boundary makes the coordinator form g+1 after that step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

Phase = Literal["rendezvous", "running", "finished", "failed", "suspended"]
Recovery = Literal["in_process", "restart", "requeue"]


@dataclass(frozen=True)
class Worker:
    worker_id: str
    node: str
    local_rank: int
    committed_step: int = -1


@dataclass(frozen=True)
class Generation:
    number: int
    ranks: tuple[str, ...]
    boundary_step: int | None
    cause: str


@dataclass(frozen=True)
class Policy:
    expected_workers: int
    min_workers: int = 1
    rendezvous_timeout_s: float = 300.0
    recovery: Recovery = "in_process"
    checkpoint_fallback: bool = False  # the job writes disaster-recovery checkpoints: a last resort exists


@dataclass(frozen=True)
class LoopEnd:
    """Where a member's training loop ended: its committed step, and how (for the messages)."""

    step: int
    how: str = ""


@dataclass(frozen=True)
class State:
    phase: Phase = "rendezvous"
    generation: Generation | None = None
    workers: Mapping[str, Worker] = field(default_factory=dict)
    draining: frozenset[str] = frozenset()
    change_requested: bool = False
    ended: Mapping[str, LoopEnd] = field(default_factory=dict)  # members of this generation whose loop ended
    rendezvous_since: float = 0.0
    expected_override: int | None = None
    reason: str = ""
    at_boundary: frozenset[str] = frozenset()  # members of this generation that reported a suspending boundary
    stop_asked: str | None = None  # a member asked the job to end at the next step boundary (`job.stop()`)

    @property
    def members(self) -> tuple[str, ...]:
        return self.generation.ranks if self.generation else ()

    @property
    def joiners(self) -> tuple[str, ...]:
        members = set(self.members)
        return tuple(w for w in self.workers if w not in members)


# --- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    worker: Worker


@dataclass(frozen=True)
class Lost:
    worker_ids: tuple[str, ...]
    cause: str


@dataclass(frozen=True)
class Drain:
    nodes: tuple[str, ...]
    mode: Literal["boundary", "now"]
    reason: str


@dataclass(frozen=True)
class ReachedBoundary:
    worker_id: str
    generation: int
    step: int


@dataclass(frozen=True)
class Faulted:
    """A member's collective failed and no new generation followed: re-form with the same members."""

    worker_id: str
    generation: int
    detail: str


@dataclass(frozen=True)
class StateLost:
    """A member found that some of the training state has no live holder (both holders of a shard lost)."""

    worker_id: str
    generation: int
    detail: str


@dataclass(frozen=True)
class Done:
    """A member's training loop ended at committed `step` of `generation`; it waits for the others'."""

    worker_id: str
    generation: int
    step: int
    how: str = ""


@dataclass(frozen=True)
class WentOn:
    """A member runs `step` of `generation` while another member's loop has ended before it."""

    worker_id: str
    generation: int
    step: int


@dataclass(frozen=True)
class StopAsked:
    """A member asks every member to end its loop at the next step boundary (`job.stop()`)."""

    worker_id: str
    reason: str


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Abort:
    reason: str


Event = Joined | Lost | Drain | ReachedBoundary | Faulted | StateLost | Done | WentOn | StopAsked | Tick | Abort

# --- actions ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Announce:
    """Send the new generation to its members and `Leave` to `leaving` (alive, but no longer wanted)."""

    generation: Generation
    leaving: tuple[str, ...]
    joined: tuple[str, ...]
    left: tuple[str, ...]


@dataclass(frozen=True)
class Dismiss:
    """Tell workers that are not members (joiners, drained nodes) to leave; the generation is unchanged."""

    worker_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class RequestBoundary:
    generation: int


@dataclass(frozen=True)
class RestartAll:
    reason: str
    fallback: bool = False  # the last resort after every holder of the state was lost (not restart mode)


@dataclass(frozen=True)
class Complete:
    reason: str


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class Suspend:
    """Every member is leaving: stop the job at the boundary, keeping a disaster-recovery checkpoint."""

    reason: str
    step: int


Action = Announce | Dismiss | RequestBoundary | RestartAll | Complete | Fail | Suspend


@dataclass(frozen=True)
class Outcome:
    state: State
    actions: tuple[Action, ...]
    reason: str


# --- ordering ---------------------------------------------------------------------------------------


def _natural_key(text: str) -> tuple[object, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _worker_key(worker: Worker) -> tuple[object, ...]:
    return (_natural_key(worker.node), worker.local_rank, worker.worker_id)


def order_ranks(survivors: Iterable[str], newcomers: Iterable[Worker]) -> tuple[str, ...]:
    """Survivors keep their relative order (their ranks shift down); newcomers follow, node by node."""
    return tuple(survivors) + tuple(w.worker_id for w in sorted(newcomers, key=_worker_key))


# --- the reducer ------------------------------------------------------------------------------------


def decide(state: State, event: Event, now: float, policy: Policy) -> Outcome:
    if state.phase in ("finished", "failed", "suspended"):
        return Outcome(state, (), f"job is {state.phase}; {type(event).__name__} ignored")
    match event:
        case Joined():
            return _joined(state, event, now, policy)
        case Lost():
            return _lost(state, event, now, policy)
        case Drain():
            return _drain(state, event, now, policy)
        case ReachedBoundary():
            return _boundary(state, event)
        case Faulted():
            gen = state.generation
            if state.phase != "running" or gen is None or event.generation != gen.number:
                return Outcome(state, (), f"stale fault report for generation {event.generation}")
            return _abrupt(state, set(), set(), f"collective failure: {event.detail}", policy, now)
        case StateLost():
            return _state_lost(state, event, now, policy)
        case Done():
            return _done(state, event)
        case WentOn():
            return _went_on(state, event)
        case StopAsked():
            return _stop_asked(state, event)
        case Tick():
            return _tick(state, now, policy)
        case Abort():
            return Outcome(replace(state, phase="failed", reason=event.reason), (Fail(event.reason),), event.reason)


def _expected(state: State, policy: Policy) -> int:
    return state.expected_override if state.expected_override is not None else policy.expected_workers


def _start(state: State, cause: str, reason: str) -> Outcome:
    number = state.generation.number + 1 if state.generation else 1
    ranks = order_ranks((), state.workers.values())
    gen = Generation(number, ranks, None, cause)
    # A drained node whose workers were all lost before a restart had its restarted workers refused: the
    # drain is done, and must not outlive the generation (nor refuse that node's later joiners).
    draining = _hosting(state.draining, state.workers)
    new = replace(
        state,
        phase="running",
        generation=gen,
        draining=draining,
        change_requested=False,
        expected_override=None,
        at_boundary=frozenset(),
        ended={},
        stop_asked=None,  # every worker starts again: its script decides again
    )
    return Outcome(new, (Announce(gen, (), ranks, ()),), reason)


def _joined(state: State, event: Joined, now: float, policy: Policy) -> Outcome:
    worker = event.worker
    if worker.node in state.draining:
        reason = f"node {worker.node} is draining"
        return Outcome(state, (Dismiss((worker.worker_id,), reason),), f"{worker.worker_id} refused: {reason}")
    workers = {**state.workers, worker.worker_id: worker}
    state = replace(state, workers=workers)
    if state.phase == "rendezvous":
        if not state.generation and len(workers) == 1:
            state = replace(state, rendezvous_since=now)
        expected = _expected(state, policy)
        if len(workers) >= expected:
            cause = "restart" if state.generation else "start"
            return _start(state, cause, f"all {expected} expected workers registered")
        return Outcome(state, (), f"rendezvous: {len(workers)} of {expected} workers")
    if state.change_requested:
        return Outcome(state, (), f"{worker.worker_id} waits for the pending boundary")
    gen = state.generation
    assert gen is not None  # running implies a generation
    return Outcome(
        replace(state, change_requested=True),
        (RequestBoundary(gen.number),),
        f"{worker.worker_id} joins at the next step boundary",
    )


def _hosting(nodes: frozenset[str], workers: Mapping[str, Worker]) -> frozenset[str]:
    """The draining nodes that still host a worker; a node whose workers are all gone has nothing left to drain."""
    return frozenset(n for n in nodes if any(w.node == n for w in workers.values()))


def _abrupt(state: State, lost: set[str], leaving: set[str], cause: str, policy: Policy, now: float) -> Outcome:
    """Members `lost` are gone (and `leaving` must go): form g+1 at once, or restart everything."""
    gen = state.generation
    assert gen is not None
    gone = lost | leaving
    workers = {k: v for k, v in state.workers.items() if k not in gone}
    survivors = [w for w in gen.ranks if w not in gone]
    base = replace(state, workers=workers, ended={w: e for w, e in state.ended.items() if w not in gone})
    if survivors and all(w in base.ended for w in survivors):  # each holds the step it ended at
        return _complete(base, f"every remaining member's loop ended ({cause} took the others)")
    if not survivors and policy.checkpoint_fallback and policy.recovery == "in_process":
        # Every holder of the state is gone: restart the workers that remain from the latest checkpoint.
        reason = f"all members lost ({cause}); no peer holds the training state: resuming from the latest checkpoint"
        return _restart_all(base, workers, reason, now, fallback=True)
    if not survivors:
        reason = (
            f"all members lost ({cause}); no peer holds the training state, and the job writes no disaster-recovery "
            "checkpoint (--checkpoint-dir with --checkpoint-every would have let it resume)"
        )
        return Outcome(replace(base, phase="failed", reason=reason), (Fail(reason),), reason)
    if policy.recovery == "requeue":  # the usual Slurm practice, kept as a baseline: the whole job starts over
        reason = f"{cause}: the job must be requeued and resumed from its latest checkpoint"
        return Outcome(replace(base, phase="failed", reason=reason), (Fail(reason),), reason)
    if policy.recovery == "restart":
        reason = f"{cause}: restarting all {len(workers)} workers from the latest checkpoint"
        return _restart_all(base, workers, reason, now, fallback=False)
    drained = {w for w in survivors if workers[w].node in state.draining}
    if drained and len(drained) < len(survivors):
        survivors = [w for w in survivors if w not in drained]
        workers = {k: v for k, v in workers.items() if k not in drained}
        draining = state.draining - {state.workers[w].node for w in drained}
    else:
        drained, draining = set(), state.draining
    draining = _hosting(draining, workers)
    members = set(gen.ranks)  # a set: this runs once per lost worker, over every worker
    # A survivor whose loop ended makes the job end at that step: a joiner would run on past it (WentOn).
    joiners = [] if base.ended else [workers[w] for w in workers if w not in members]
    ranks = order_ranks(survivors, joiners)
    new_gen = Generation(gen.number + 1, ranks, None, cause)
    # Every survivor is on a draining node: they stay for now, and the drain still needs a boundary of g+1.
    pending = any(workers[w].node in draining for w in ranks)
    new = replace(
        base,
        generation=new_gen,
        workers=workers,
        draining=draining,
        change_requested=pending or base.stop_asked is not None,
        at_boundary=frozenset(),
        ended={},
    )
    pending = new.change_requested
    left = tuple(sorted(lost | leaving | drained))
    announce = Announce(new_gen, tuple(sorted(leaving | drained)), tuple(j.worker_id for j in joiners), left)
    actions: tuple[Action, ...] = (announce, RequestBoundary(new_gen.number)) if pending else (announce,)
    return Outcome(new, actions, f"{cause}: {', '.join(left)} left; world {len(gen.ranks)} -> {len(ranks)}")


def _state_lost(state: State, event: StateLost, now: float, policy: Policy) -> Outcome:
    gen = state.generation
    if state.phase != "running" or gen is None or event.generation != gen.number:
        return Outcome(state, (), f"stale state-lost report for generation {event.generation}")
    if policy.checkpoint_fallback and policy.recovery == "in_process":
        reason = f"training state lost ({event.detail}): resuming from the latest checkpoint"
        return _restart_all(state, state.workers, reason, now, fallback=True)
    reason = (
        f"training state lost ({event.detail}), and the job writes no disaster-recovery checkpoint "
        "(--checkpoint-dir with --checkpoint-every would have let it resume)"
    )
    return Outcome(replace(state, phase="failed", reason=reason), (Fail(reason),), reason)


def _restart_all(base: State, workers: Mapping[str, Worker], reason: str, now: float, *, fallback: bool) -> Outcome:
    """Every remaining worker starts again and the job re-forms from its latest checkpoint."""
    expected = max(1, len(workers))  # restarted workers that arrive later join at a boundary
    restarted = replace(base, phase="rendezvous", workers={}, expected_override=expected, rendezvous_since=now)
    return Outcome(restarted, (RestartAll(reason, fallback),), reason)


def _lost(state: State, event: Lost, now: float, policy: Policy) -> Outcome:
    known = set(event.worker_ids) & set(state.workers)
    if not known:
        return Outcome(state, (), "lost workers were not part of the job")
    members_lost = known & set(state.members)
    if state.phase == "rendezvous" or not members_lost:
        workers = {k: v for k, v in state.workers.items() if k not in known}
        return Outcome(replace(state, workers=workers), (), f"{', '.join(sorted(known))} gone before joining")
    return _abrupt(state, known, set(), event.cause, policy, now)


def _drain(state: State, event: Drain, now: float, policy: Policy) -> Outcome:
    nodes = set(event.nodes)
    on_nodes = {w for w, rec in state.workers.items() if rec.node in nodes}
    if not on_nodes:
        return Outcome(state, (), f"no workers on {sorted(nodes)}")
    members_on = on_nodes & set(state.members)
    waiting = tuple(sorted(on_nodes - members_on))
    dismiss: tuple[Action, ...] = (Dismiss(waiting, event.reason),) if waiting else ()
    state = replace(state, workers={k: v for k, v in state.workers.items() if k not in waiting})
    if not members_on:
        return Outcome(state, dismiss, f"{', '.join(waiting)} leave before joining ({event.reason})")
    if event.mode == "now":
        out = _abrupt(state, set(), members_on, f"drain-now: {event.reason}", policy, now)
        return Outcome(out.state, dismiss + out.actions, out.reason)
    gen = state.generation
    assert gen is not None
    drained_nodes = {state.workers[w].node for w in members_on}
    new = replace(state, draining=state.draining | drained_nodes, change_requested=True)
    if state.change_requested:
        return Outcome(new, dismiss, f"drain of {sorted(drained_nodes)} joins the pending boundary")
    actions = (*dismiss, RequestBoundary(gen.number))
    return Outcome(new, actions, f"drain {sorted(drained_nodes)} at the next step boundary")


def _boundary(state: State, event: ReachedBoundary) -> Outcome:
    gen = state.generation
    if state.phase != "running" or gen is None or event.generation != gen.number:
        return Outcome(state, (), f"stale boundary report for generation {event.generation}")
    drained = {w for w in gen.ranks if w in state.workers and state.workers[w].node in state.draining}
    staying = [w for w in gen.ranks if w not in drained]
    joiners = [state.workers[w] for w in state.joiners]
    if not staying or state.stop_asked is not None:
        # Stop only once every member holds that step: a Stop interrupts a member still reducing it, and the
        # suspension checkpoint must be written by a member that committed it.
        reported = state.at_boundary | {event.worker_id}
        behind = [w for w in gen.ranks if w in state.workers and w not in state.ended and w not in reported]
        what = "ending" if staying else "suspending"
        if behind:
            reason = f"{what} after step {event.step}: waiting for {', '.join(behind)} to reach it"
            return Outcome(replace(state, at_boundary=reported), (), reason)
        if staying:  # every member's loop ends there
            ended = {w: LoopEnd(event.step, "job.stop()") for w in gen.ranks}
            return _complete(replace(state, ended=ended), f"stopped after step {event.step}: {state.stop_asked}")
        reason = f"every member is leaving ({sorted(state.draining)}); suspending after step {event.step}"
        new = replace(state, phase="suspended", reason=reason)
        return Outcome(new, (Suspend(reason, event.step),), reason)
    ranks = order_ranks(staying, joiners)
    causes = [c for c, on in (("join", joiners), ("drain", drained)) if on] or ["boundary"]
    new_gen = Generation(gen.number + 1, ranks, event.step, "+".join(causes))
    workers = {k: v for k, v in state.workers.items() if k not in drained}
    drained_nodes = {state.workers[w].node for w in drained}
    new = replace(
        state,
        generation=new_gen,
        workers=workers,
        change_requested=False,
        draining=_hosting(state.draining - drained_nodes, workers),
        at_boundary=frozenset(),
        ended={},
    )
    left = tuple(sorted(drained))
    announce = Announce(new_gen, left, tuple(j.worker_id for j in joiners), left)
    return Outcome(new, (announce,), f"after step {event.step}: world {len(gen.ranks)} -> {len(ranks)}")


def _complete(state: State, reason: str) -> Outcome:
    return Outcome(replace(state, phase="finished", reason=reason), (Complete(reason),), reason)


def _fail(state: State, reason: str) -> Outcome:
    return Outcome(replace(state, phase="failed", reason=reason), (Fail(reason),), reason)


def _current(state: State, generation: int, worker_id: str) -> bool:
    """The report is from a member of the running generation (else it is stale, or from a stranger)."""
    gen = state.generation
    return state.phase == "running" and gen is not None and gen.number == generation and worker_id in gen.ranks


LOOPS_AGREE = (
    "every rank must leave its loop at the same step: a condition all ranks compute alike (the same "
    "total_steps, a test of job.step), or job.stop() for a decision one rank makes"
)


def _done(state: State, event: Done) -> Outcome:
    who = event.worker_id
    if not _current(state, event.generation, who):
        return Outcome(state, (), f"loop end of {who} in generation {event.generation} ignored: not current")
    end = LoopEnd(event.step, event.how)
    other = next(((w, e) for w, e in state.ended.items() if e.step != end.step), None)
    if other is not None:
        w, e = other
        both = f"{_where(w, e)}, {_where(who, end)}"
        return _fail(state, f"the training loops ended at different steps: {both}; {LOOPS_AGREE}")
    ended = {**state.ended, who: end}
    new = replace(state, ended=ended)
    if all(w in ended for w in new.members):
        return _complete(new, f"every member's loop ended at step {end.step} ({end.how or 'its end'})")
    return Outcome(new, (), f"{who}'s loop ended at step {end.step}: {len(ended)} of {len(new.members)} members")


def _where(worker_id: str, end: LoopEnd) -> str:
    return f"{worker_id} at step {end.step}" + (f" ({end.how})" if end.how else "")


def _went_on(state: State, event: WentOn) -> Outcome:
    who = event.worker_id
    if not _current(state, event.generation, who):
        return Outcome(state, (), f"progress of {who} in generation {event.generation} ignored: not current")
    before = next(((w, e) for w, e in state.ended.items() if e.step < event.step), None)
    if before is None:
        return Outcome(state, (), f"{who} runs step {event.step}: no loop ended before it")
    w, e = before
    return _fail(state, f"the loop of {_where(w, e)} ended, but {who} went on to step {event.step}; {LOOPS_AGREE}")


def _stop_asked(state: State, event: StopAsked) -> Outcome:
    gen = state.generation
    if state.phase != "running" or gen is None or event.worker_id not in gen.ranks:
        return Outcome(state, (), f"stop asked by {event.worker_id} ignored: not a member of a running generation")
    if state.stop_asked is not None:
        return Outcome(state, (), f"stop asked by {event.worker_id}: already asked ({state.stop_asked})")
    new = replace(state, stop_asked=f"{event.reason} (asked by {event.worker_id})", change_requested=True)
    actions: tuple[Action, ...] = () if state.change_requested else (RequestBoundary(gen.number),)
    return Outcome(new, actions, f"{event.worker_id} asks the job to end at the next step boundary")


def _tick(state: State, now: float, policy: Policy) -> Outcome:
    if state.phase != "rendezvous" or not state.workers:
        return Outcome(state, (), "nothing due")
    if now - state.rendezvous_since < policy.rendezvous_timeout_s:
        return Outcome(state, (), "rendezvous in progress")
    have, expected = len(state.workers), _expected(state, policy)
    if have >= policy.min_workers:
        cause = "restart" if state.generation else "start"
        return _start(state, cause, f"rendezvous timed out: starting with {have} of {expected} workers")
    reason = f"rendezvous timed out with {have} of {expected} workers (need at least {policy.min_workers})"
    return Outcome(replace(state, phase="failed", reason=reason), (Fail(reason),), reason)
