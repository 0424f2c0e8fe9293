"""Which nodes of the allocation get a new agent after theirs was lost, and when the launcher gives up on one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.decide.slurm_watch import AgentSteps, Relaunches, agent_steps, relaunches
from slurm_elastic.slurm import NodeInfo

NAMES = ["n1", "n2", "n3", "n4"]


def node(name: str, state: str = "ALLOCATED", flags: frozenset[str] = frozenset()) -> NodeInfo:
    return NodeInfo(name=name, state=state, flags=flags, reason="", partitions=())


def plan(allocation: list[NodeInfo], **kwargs: object) -> Relaunches:
    args: dict[str, object] = {
        "had_agent": set(NAMES), "have_agent": {"n1"}, "excluded": set(), "starting": set(), "tries": {},
        "now": 100.0, "retry_s": 15.0, "max_tries": 3,
    }  # fmt: skip
    args.update(kwargs)
    return relaunches(allocation, **args)  # type: ignore[arg-type]


def test_a_node_that_came_back_gets_an_agent_unless_excluded_down_or_still_starting() -> None:
    allocation = [node("n1"), node("n2"), node("n3"), node("n4", "DOWN")]
    assert plan(allocation) == Relaunches(["n2", "n3"], [])  # n1 has its agent, n4 is still down
    assert plan(allocation, excluded={"n3"}).start == ["n2"]  # drained on purpose (or given up)
    assert plan(allocation, starting={"n2"}).start == ["n3"]  # a new agent still starting there
    assert plan(allocation, had_agent={"n1"}).start == []  # never had one: not ours to start
    assert plan([node("n2", "MIXED", frozenset({"DRAIN"})), node("n3", "IDLE", frozenset({"FAIL"}))]).start == []


def test_a_relaunched_agents_srun_counts_as_starting_only_until_its_agent_registers() -> None:
    assert agent_steps({"n2"}, set(), set()) == AgentSteps(starting={"n2"}, stale=set())  # still starting
    assert agent_steps({"n2"}, {"n2"}, {"n2"}) == AgentSteps(starting=set(), stale=set())  # running
    # Its agent registered, then its node died: srun lives on, waiting for tasks that are gone. It must not
    # keep the node from getting a new agent (seen in `chaos --slurm --seed 12`: the job never refilled).
    assert agent_steps({"n2"}, {"n2"}, set()) == AgentSteps(starting=set(), stale={"n2"})
    assert agent_steps(set(), {"n2"}, set()) == AgentSteps(starting=set(), stale=set())  # its srun ended


@given(
    alive=st.sets(st.sampled_from(NAMES)),
    registered=st.sets(st.sampled_from(NAMES)),
    have=st.sets(st.sampled_from(NAMES)),
)
def test_a_live_srun_is_starting_or_stale_or_running_never_two(
    alive: set[str], registered: set[str], have: set[str]
) -> None:
    steps = agent_steps(alive, registered, have)
    assert steps.starting | steps.stale <= alive and not steps.starting & steps.stale
    assert steps.starting == alive - registered and not steps.stale & have


def test_new_agents_are_spaced_and_bounded_then_the_node_is_given_up_once() -> None:
    allocation = [node("n2")]
    assert plan(allocation, tries={"n2": (1, 90.0)}) == Relaunches([], [])  # 10 s after the last: wait
    assert plan(allocation, tries={"n2": (1, 85.0)}) == Relaunches(["n2"], [])
    assert plan(allocation, tries={"n2": (3, 90.0)}) == Relaunches([], [])  # the third still gets its time
    assert plan(allocation, tries={"n2": (3, 85.0)}) == Relaunches([], ["n2"])
    assert plan(allocation, max_tries=0) == Relaunches([], ["n2"])  # relaunching switched off


@given(
    states=st.lists(st.sampled_from(["ALLOCATED", "MIXED", "DOWN", "IDLE"]), min_size=4, max_size=4),
    have=st.sets(st.sampled_from(NAMES)),
    excluded=st.sets(st.sampled_from(NAMES)),
    starting=st.sets(st.sampled_from(NAMES)),
    tries=st.dictionaries(st.sampled_from(NAMES), st.tuples(st.integers(0, 5), st.floats(0, 100))),
    max_tries=st.integers(0, 4),
)
def test_a_simulated_run_starts_at_most_max_tries_agents_per_node(
    states: list[str], have: set[str], excluded: set[str], starting: set[str],
    tries: dict[str, tuple[int, float]], max_tries: int,
) -> None:  # fmt: skip
    allocation = [node(n, s) for n, s in zip(NAMES, states, strict=True)]
    out = plan(allocation, have_agent=have, excluded=excluded, starting=starting, tries=tries, max_tries=max_tries)
    assert not set(out.start) & set(out.give_up)
    for name in out.start + out.give_up:
        assert name not in have | excluded | starting
        assert allocation[NAMES.index(name)].state != "DOWN"
        assert 100.0 - tries.get(name, (0, 0.0))[1] >= 15.0
    assert all(tries.get(n, (0, 0.0))[0] < max_tries for n in out.start)
    assert all(tries.get(n, (0, 0.0))[0] >= max_tries for n in out.give_up)


@given(
    states=st.lists(st.sampled_from(["ALLOCATED", "MIXED", "DOWN"]), min_size=4, max_size=4),
    max_tries=st.integers(0, 4),
)
def test_the_launchers_loop_starts_max_tries_agents_on_a_node_that_never_registers_then_gives_it_up(
    states: list[str], max_tries: int
) -> None:
    allocation = [node(n, s) for n, s in zip(NAMES, states, strict=True)]
    tries: dict[str, tuple[int, float]] = {}
    given_up: set[str] = set()
    started = dict.fromkeys(NAMES, 0)
    for now in range(0, 400, 5):  # the launcher's node watch, every 5 s: n1's agent is there, no other comes
        step = plan(allocation, excluded=given_up, tries=tries, now=float(now), max_tries=max_tries)
        given_up |= set(step.give_up)
        for name in step.start:
            started[name] += 1
            tries[name] = (tries.get(name, (0, 0.0))[0] + 1, float(now))
    lost = {n for n, state in zip(NAMES, states, strict=True) if n != "n1" and state != "DOWN"}
    assert started == {n: max_tries if n in lost else 0 for n in NAMES}
    assert given_up == lost
