from __future__ import annotations

import pytest

from slurm_elastic.commands.jobs import choose_nodes_to_reclaim, render_status, trains_on
from slurm_elastic.decide.slurm_watch import drains_for, satellites_to_submit
from slurm_elastic.errors import ElasticError
from slurm_elastic.slurm import NodeInfo
from slurm_elastic.wire.messages import MemberStatus, StatusReply


def status(nodes: dict[str, str]) -> StatusReply:
    return StatusReply(
        job_id="10",
        state="running",
        generation=3,
        world_size=len(nodes),
        step=42,
        loss=1.5,
        samples_per_s=100.0,
        nodes=sorted(nodes),
        node_jobs=nodes,
        members=[
            MemberStatus(worker_id=f"{n}:0:0", node=n, rank=i, step=42, phase="compute", last_seen_s=0.1)
            for i, n in enumerate(sorted(nodes))
        ],
        pending=[],
        draining=[],
        events=[{"event": "membership_change", "job": "10", "time": 0.0, "generation": 3, "cause": "join"}],
    )


def test_reclaim_takes_satellites_first_then_core_nodes_from_the_last_never_the_batch_host() -> None:
    s = status({"n1": "10", "n2": "10", "n3": "10", "n4": "11", "n5": "12"})
    assert choose_nodes_to_reclaim(s, "10", "n1", 2) == ["n4", "n5"]
    assert choose_nodes_to_reclaim(s, "10", "n1", 3) == ["n4", "n5", "n3"]
    assert choose_nodes_to_reclaim(s, "10", "n1", 4) == ["n4", "n5", "n3", "n2"]
    with pytest.raises(ElasticError, match=r"at most 4 nodes.*batch host n1 stays"):
        choose_nodes_to_reclaim(s, "10", "n1", 5)


def test_a_reclaimed_node_has_left_once_it_hosts_no_worker_and_no_pending_drain() -> None:
    s = status({"n1": "10", "n2": "10", "n3": "10"})
    assert trains_on(s, ["n3"]) and trains_on(s, ["n4", "n3"])
    assert not trains_on(s, ["n4"])  # an agent without workers (a held one) trains nothing
    gone = s.model_copy(update={"members": [m for m in s.members if m.node != "n3"]})
    assert not trains_on(gone, ["n3"])
    assert trains_on(gone.model_copy(update={"draining": ["n3"]}), ["n3"])  # the drain has not happened yet


def test_status_names_the_generation_members_and_satellites() -> None:
    text = render_status(status({"n1": "10", "n2": "11"}))
    assert "job 10: running, generation 3, world 2, step 42, loss 1.5000, 100.0 samples/s" in text
    assert "n2 (slurm job 11)" in text
    assert "rank 1   n2:0:0" in text
    assert "membership_change generation=3 cause=join" in text  # a record short of its kind's fields


def test_status_tells_a_membership_change_as_a_sentence() -> None:
    change = {
        "event": "membership_change", "job": "10", "time": 0.0, "generation": 4, "cause": "connection closed",
        "world_before": 3, "world": 2, "ranks": ["n1:0:0", "n2:0:0"], "joined": [], "left": ["n3:0:0"],
        "boundary_step": None, "trigger": "Lost",
    }  # fmt: skip
    text = render_status(status({"n1": "10", "n2": "10"}).model_copy(update={"events": [change]}))
    assert "membership_change generation 4: world 3 -> 2 (connection closed); left n3:0:0" in text


def node(name: str, state: str, flags: frozenset[str] = frozenset(), reason: str = "") -> NodeInfo:
    return NodeInfo(name=name, state=state, flags=flags, reason=reason, partitions=())


def test_slurm_node_states_become_drains_once() -> None:
    nodes = [
        node("n1", "ALLOCATED"),
        node("n2", "ALLOCATED", frozenset({"DRAIN"}), "bad fan"),
        node("n3", "DOWN", frozenset(), "not responding"),
        node("n4", "IDLE", frozenset({"DRAIN"})),  # not ours
    ]
    drains = drains_for(nodes, {"n1", "n2", "n3"}, set())
    assert [(d.node, d.mode) for d in drains] == [("n2", "boundary"), ("n3", "now")]
    assert "bad fan" in drains[0].reason
    assert drains_for(nodes, {"n1", "n2", "n3"}, {"n2", "n3"}) == []


def test_a_node_resumed_after_its_drain_is_drained_again_the_next_time() -> None:
    from slurm_elastic.decide.slurm_watch import back_in_service

    notified = {"n2", "n3", "n4"}
    now = [node("n2", "ALLOCATED"), node("n3", "DOWN"), node("n4", "IDLE", frozenset({"DRAIN"})), node("n5", "IDLE")]
    assert back_in_service(now, notified) == {"n2"}  # n3 still down, n4 still drained, n5 never drained
    later = [node("n2", "ALLOCATED", frozenset({"DRAIN"}), "again")]
    assert [d.node for d in drains_for(later, {"n2"}, notified - {"n2"})] == ["n2"]


def test_satellite_pool_keeps_the_number_pending() -> None:
    assert satellites_to_submit(pending=0, keep_pending=3) == 3
    assert satellites_to_submit(pending=2, keep_pending=3) == 1
    assert satellites_to_submit(pending=5, keep_pending=3) == 0
    assert satellites_to_submit(pending=0, keep_pending=500, limit=64) == 64
