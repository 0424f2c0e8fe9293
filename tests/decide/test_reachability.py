"""Which nodes a cut between members evicts: the fewest that leave no failing pair, the later ranks first."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.decide.reachability import cleared, to_evict

NODES = ("n1", "n2", "n3", "n4")


def test_nobody_goes_when_every_node_reaches_every_other() -> None:
    assert to_evict([], NODES) == ()
    assert to_evict([("n2", "n2")], NODES) == ()  # a node's own address is not a cut


def test_of_a_one_way_cut_the_node_with_the_later_ranks_goes() -> None:
    assert to_evict([("n2", "n3")], NODES) == ("n3",)
    assert to_evict([("n3", "n2"), ("n2", "n3")], NODES) == ("n3",)  # seen from both ends: one pair
    assert to_evict([("n3", "n1")], NODES) == ("n3",)  # rank 0's node (the coordinator's) stays


def test_a_node_cut_from_several_goes_alone() -> None:
    # n2 reaches nobody: evicting it resolves every pair, though n1 is in as many pairs as the others.
    failing = [("n2", "n1"), ("n2", "n3"), ("n2", "n4"), ("n1", "n2")]
    assert to_evict(failing, NODES) == ("n2",)


def test_two_separate_cuts_take_one_node_each() -> None:
    assert to_evict([("n1", "n2"), ("n3", "n4")], NODES) == ("n2", "n4")


def test_a_node_the_order_lacks_counts_as_the_last() -> None:
    assert to_evict([("n1", "x9")], NODES) == ("x9",)


@given(st.sets(st.tuples(st.sampled_from(NODES), st.sampled_from(NODES))), st.permutations(NODES))
def test_what_remains_has_no_failing_pair_and_no_node_goes_in_vain(
    failing: set[tuple[str, str]], order: list[str]
) -> None:
    evicted = to_evict(failing, order)
    rest = [n for n in NODES if n not in evicted]
    assert all(cleared(n, [p for p in failing if not set(p) & set(evicted)]) for n in rest)
    assert len(set(evicted)) == len(evicted)
    real = {frozenset(p) for p in failing if p[0] != p[1]}
    for node in evicted:  # every evicted node was in some failing pair
        assert any(node in pair for pair in real)
    # Never more than one node per failing pair, and never more than a minimum cover allows greedily.
    assert len(evicted) <= len(real)
    minimum = next(
        k
        for k in range(len(NODES) + 1)
        for chosen in itertools.combinations(NODES, k)
        if all(set(chosen) & pair for pair in real)
    )
    assert len(evicted) <= 2 * minimum


def test_cleared_names_whether_a_node_is_in_any_failing_pair() -> None:
    assert cleared("n3", [("n1", "n2")])
    assert not cleared("n3", [("n1", "n3")])
    assert not cleared("n3", [("n3", "n1")])
