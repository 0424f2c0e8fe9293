"""When silence leaves the coordinator's side without a majority of the job's nodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_elastic.decide.quorum import SilenceWindow, lost, observe, verdict

NODES = frozenset({"n1", "n2", "n3", "n4"})
LEASE = 5.0


def test_one_silent_node_of_four_is_a_loss_the_job_survives() -> None:
    window = observe(None, 10.0, NODES, {"n4"}, LEASE)
    assert window == SilenceWindow(10.0, NODES, frozenset({"n4"}))
    assert not lost(window)


def test_the_batch_host_cut_off_from_three_others_is_the_smaller_side() -> None:
    window = observe(None, 10.0, NODES, {"n2", "n3", "n4"}, LEASE)
    assert lost(window)


def test_silences_of_one_cut_spread_over_scans_add_up() -> None:
    window = observe(None, 10.0, NODES, {"n2"}, LEASE)
    assert not lost(window)
    window = observe(window, 10.5, NODES - {"n2"}, set(), LEASE)  # a scan with no silence keeps it
    assert window is not None and window.silent == {"n2"}
    window = observe(window, 11.0, NODES - {"n2"}, {"n3"}, LEASE)  # n2 already evicted: the window keeps it
    assert window is not None and window.nodes == NODES
    assert lost(window)  # two of four: no majority left


def test_silences_a_lease_apart_are_separate_losses() -> None:
    window = observe(None, 10.0, NODES, {"n2"}, LEASE)
    window = observe(window, 16.0, NODES - {"n2"}, {"n3"}, LEASE)
    assert window == SilenceWindow(16.0, NODES - {"n2"}, frozenset({"n3"}))
    assert not lost(window)
    assert observe(window, 30.0, NODES - {"n2", "n3"}, set(), LEASE) is None


def test_half_of_two_nodes_is_no_majority_and_a_single_node_is_never_judged() -> None:
    assert lost(observe(None, 1.0, {"n1", "n2"}, {"n2"}, LEASE))
    assert not lost(observe(None, 1.0, {"n1"}, {"n1"}, LEASE))
    assert not lost(None)


@given(st.sets(st.sampled_from(sorted(NODES)), min_size=1))
def test_lost_exactly_when_the_silent_are_at_least_half(silent: set[str]) -> None:
    assert lost(observe(None, 0.0, NODES, silent, LEASE)) == (2 * len(silent) >= len(NODES))


def test_a_silent_node_is_evicted_at_once_unless_the_quiet_would_make_half() -> None:
    window = observe(None, 10.0, NODES, {"n4"}, LEASE)
    assert verdict(window, NODES - {"n4"}, set()) == "go"
    assert verdict(window, NODES - {"n4"}, {"n3"}) == "wait"  # n3 may be the same cut, a scan behind
    window = observe(window, 10.5, NODES - {"n4"}, {"n3"}, LEASE)
    assert verdict(window, NODES - {"n4"}, set()) == "stop"


def test_quiet_nodes_alone_wait_only_when_they_are_half() -> None:
    assert verdict(None, NODES, {"n4"}) == "go"
    assert verdict(None, NODES, {"n3", "n4"}) == "wait"
    assert verdict(None, {"n1"}, {"n1"}) == "go"  # a single node is never judged


@given(st.sets(st.sampled_from(sorted(NODES))), st.sets(st.sampled_from(sorted(NODES))))
def test_the_verdict_stops_exactly_at_half_silent_and_waits_exactly_at_half_silent_or_quiet(
    silent: set[str], quiet: set[str]
) -> None:
    quiet -= silent
    window = observe(None, 0.0, NODES, silent, LEASE)
    expected = "stop" if 2 * len(silent) >= 4 else "wait" if quiet and 2 * len(silent | quiet) >= 4 else "go"
    assert verdict(window, NODES - silent, quiet) == expected
