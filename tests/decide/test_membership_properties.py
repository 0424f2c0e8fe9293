"""Properties of the membership reducer over random event sequences (a handful of workers and nodes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide import membership as m

NODES = 3
TIMEOUT = 10.0


@dataclass(frozen=True)
class Cmd:
    """A command is interpreted against the state it meets, so sequences stay realistic: worker ids are never
    reused, Done comes from members, boundary and fault reports name the current or a neighbouring generation."""

    kind: str
    pick: int = 0
    variant: int = 0
    nodes: tuple[int, ...] = ()
    mode: Literal["boundary", "now"] = "boundary"


def cmd(kind: str, variants: list[int] | None = None, **extra: st.SearchStrategy[object]) -> st.SearchStrategy[Cmd]:
    return st.builds(
        Cmd,
        st.just(kind),
        st.integers(0, 40),
        st.sampled_from(variants or [0]),
        **extra,
    )


join = cmd("join", list(range(NODES)))
# 0: a member, 1: any worker ever seen (or an unknown id), 2: two members, 3: every worker on a member's node
lost = cmd("lost", [0, 0, 1, 2, 3, 3])
exit_ = cmd("exit")  # a member's loop ends, then its process exits (a crash before the job completed)
drain = cmd(
    "drain",
    nodes=st.lists(st.integers(0, NODES - 1), min_size=1, max_size=2, unique=True).map(tuple),
    mode=st.sampled_from(["boundary", "now"]),
)
boundary = cmd("boundary", [0, 0, 0, -1, 1])  # variant: generation offset (stale or future reports)
fault = cmd("fault", [0, 0, -1])
done = cmd("done", [0, 0, 0, 1, -1])  # variant: step offset (a loop that ends elsewhere disagrees)
went_on = cmd("went_on")  # a member runs the step after the one where the loops end
stop = cmd("stop")  # job.stop() on a member
tick = cmd("tick")  # time moves by a third of the rendezvous timeout
# Joins, losses and boundaries are the common events; Abort is covered by the scenario tests.
commands = st.one_of(
    join, join, lost, lost, boundary, boundary, drain, drain, fault, done, done, exit_, went_on, stop, tick
)


@st.composite
def policies(draw: st.DrawFn) -> m.Policy:
    expected = draw(st.integers(1, 3))
    return m.Policy(
        expected_workers=expected,
        min_workers=draw(st.integers(1, expected)),
        rendezvous_timeout_s=TIMEOUT,
        recovery=draw(st.sampled_from(["in_process", "in_process", "restart"])),
    )


@dataclass
class World:
    """What the test harness knows: every worker ever created, and the step counter."""

    seen: list[m.Worker] = field(default_factory=list)
    per_node: dict[int, int] = field(default_factory=dict)
    step: int = 0


def to_events(c: Cmd, state: m.State, world: World) -> list[m.Event]:
    gen = state.generation.number if state.generation else 1
    members = state.members or tuple(w.worker_id for w in world.seen) or ("nobody",)
    member = members[c.pick % len(members)]
    match c.kind:
        case "join":
            local = world.per_node.get(c.variant, 0)
            world.per_node[c.variant] = local + 1
            worker = m.Worker(f"w{len(world.seen)}", f"node{c.variant}", local)
            world.seen.append(worker)
            return [m.Joined(worker)]
        case "lost" if c.variant == 1:
            ids = [w.worker_id for w in world.seen] + ["ghost"]
            return [m.Lost((ids[c.pick % len(ids)],), "crash")]
        case "lost" if c.variant == 2:
            return [m.Lost(tuple(dict.fromkeys((member, members[(c.pick + 1) % len(members)]))), "crash")]
        case "lost" if c.variant == 3:
            node = state.workers[member].node if member in state.workers else ""
            return [m.Lost(tuple(w for w, rec in state.workers.items() if rec.node == node) or (member,), "node down")]
        case "lost":
            return [m.Lost((member,), "crash")]
        case "exit":
            return [m.Done(member, gen, world.step), m.Lost((member,), "exited with 0")]
        case "drain":
            return [m.Drain(tuple(f"node{n}" for n in c.nodes), c.mode, "reclaim")]
        case "boundary":
            world.step += 1
            return [m.ReachedBoundary(member, gen + c.variant, world.step)]
        case "fault":
            return [m.Faulted(member, gen + c.variant, "timeout")]
        case "done":
            return [m.Done(member, gen, max(0, world.step + c.variant))]
        case "went_on":
            return [m.WentOn(member, gen, world.step + 1)]
        case "stop":
            return [m.StopAsked(member, "budget")]
        case "abort":
            return [m.Abort("operator")]
        case _:
            return [m.Tick()]


def node_of(state: m.State, wid: str) -> str | None:
    w = state.workers.get(wid)
    return w.node if w else None


def check_transition(before: m.State, event: m.Event, out: m.Outcome, last_gen: int) -> int:
    """Assert the invariants of one step; returns the newest announced generation number."""
    after = out.state
    announces = [a for a in out.actions if isinstance(a, m.Announce)]
    assert len(announces) <= 1
    for action in out.actions:
        if isinstance(action, m.RequestBoundary):
            assert after.generation is not None and action.generation == after.generation.number
            assert after.change_requested
    if before.phase in ("finished", "failed", "suspended"):
        assert out.state is before and out.actions == ()
        return last_gen
    if not announces:
        assert after.generation == before.generation or after.phase == "rendezvous"
        return last_gen
    a = announces[0]
    gen = a.generation
    assert gen.number == last_gen + 1, (gen.number, last_gen)
    assert after.phase == "running" and after.generation == gen
    ranks = gen.ranks
    assert ranks and len(set(ranks)) == len(ranks)
    assert set(ranks) <= set(after.workers)  # every rank is a registered worker
    assert set(a.joined) <= set(ranks) and not set(a.leaving) & set(ranks) and not set(a.left) & set(ranks)
    drained_nodes = set(before.draining - after.draining)
    if isinstance(event, m.Drain):
        drained_nodes |= set(event.nodes)
    assert not {after.workers[w].node for w in ranks} & drained_nodes
    hosts = {w.node for w in after.workers.values()}
    assert after.draining <= hosts  # a new generation leaves no stale drain behind
    if before.phase == "running":
        assert before.generation is not None
        lost = set(event.worker_ids) if isinstance(event, m.Lost) else set()
        must_stay = {w for w in before.generation.ranks if w not in lost and node_of(before, w) not in drained_nodes}
        assert must_stay <= set(ranks), (must_stay, ranks)
        if gen.boundary_step is None:
            assert isinstance(event, m.Lost | m.Drain | m.Faulted)
        else:
            assert isinstance(event, m.ReachedBoundary) and gen.boundary_step == event.step
    return gen.number


@settings(deadline=None, max_examples=600)
@given(pol=policies(), cmds=st.lists(commands, min_size=10, max_size=60))
def test_random_event_sequences_keep_the_invariants(pol: m.Policy, cmds: list[Cmd]) -> None:
    state, world, now, last_gen = m.State(), World(), 0.0, 0
    requested_for: int | None = None
    for event in (e for c in cmds for e in to_events(c, state, world)):
        if isinstance(event, m.Tick):
            now += TIMEOUT / 3
        before_workers = dict(state.workers)  # the only mutable part of a State; workers are frozen
        out = m.decide(state, event, now, pol)  # never raises
        assert state.workers == before_workers  # the input is not changed
        assert m.decide(state, event, now, pol) == out  # pure: same input, same output
        last_gen = check_transition(state, event, out, last_gen)
        for action in out.actions:
            if isinstance(action, m.RequestBoundary):
                requested_for = action.generation
        state = out.state
        if state.phase == "running":
            gen = state.generation
            assert gen is not None
            # every member is still registered; loops ended in this generation, at one step, by members
            assert all(w in state.workers for w in gen.ranks)
            assert set(state.ended) <= set(gen.ranks) and len({e.step for e in state.ended.values()}) <= 1
            if state.stop_asked is not None:  # a stop is carried by a boundary of this generation
                assert state.change_requested and requested_for == gen.number
            # a pending change (a joiner, or a member on a draining node) has asked this generation for a boundary
            on_draining = [w for w in gen.ranks if node_of(state, w) in state.draining]
            if state.joiners or on_draining:
                assert state.change_requested and requested_for == gen.number, (state, requested_for)


@settings(deadline=None, max_examples=200)
@given(pol=policies(), cmds=st.lists(st.one_of(commands, cmd("abort")), max_size=25))
def test_terminal_phases_are_explained_and_absorbing(pol: m.Policy, cmds: list[Cmd]) -> None:
    state, world = m.State(), World()
    terminal: m.State | None = None
    for event in (e for c in cmds for e in to_events(c, state, world)):
        out = m.decide(state, event, 0.0, pol)
        if terminal is not None:
            assert out.state is terminal and out.actions == ()
        if out.state.phase in ("finished", "failed", "suspended") and terminal is None:
            terminal = out.state
            kinds = {type(a) for a in out.actions}
            assert kinds & {m.Complete, m.Fail, m.Suspend}
            assert out.state.reason
        state = out.state
