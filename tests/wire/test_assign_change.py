"""An Assign's ranks as a change since the last generation: resolved by the worker to exactly the list the
coordinator's reducer formed, or refused where the worker cannot know the base."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from slurm_elastic.coordinator.driver import ranks_change
from slurm_elastic.decide.membership import Generation
from slurm_elastic.errors import ProtocolError
from slurm_elastic.wire.channel import encode_frame
from slurm_elastic.wire.messages import Assign, parse_message


def _assign(generation: int, rank: int, **ranks: object) -> Assign:
    return Assign(generation=generation, rank=rank, boundary_step=None, cause="test", **ranks)  # type: ignore[arg-type]


@given(
    old=st.lists(st.integers(0, 60), min_size=1, max_size=30, unique=True),
    data=st.data(),
)
def test_a_change_resolves_to_the_reducers_ranks(old: list[int], data: st.DataObject) -> None:
    """Survivors in their order, then newcomers: the change, sent over the wire and resolved against the old
    generation's assign, gives the new list exactly, for every member's rank."""
    old_ids = [f"w{i}" for i in old]
    survivors = [w for w in old_ids if data.draw(st.booleans())]
    newcomers = [f"new{i}" for i in range(data.draw(st.integers(0, 5)))]
    new_ids = tuple(survivors + newcomers)
    if not new_ids:
        return
    diff = ranks_change(Generation(3, tuple(old_ids), None, "x"), Generation(4, new_ids, None, "y"))
    assert diff is not None and diff["since"] == 3
    known = _assign(3, 0, ranks=old_ids)
    for rank in range(len(survivors)):
        wire = parse_message(encode_frame(_assign(4, rank, **diff))[4:])
        assert isinstance(wire, Assign)
        resolved = wire.resolved(known)
        assert resolved.ranks == list(new_ids) and resolved.since is None and resolved.rank == rank


def test_reordered_survivors_go_whole() -> None:
    assert ranks_change(Generation(1, ("a", "b"), None, "x"), Generation(2, ("b", "a"), None, "y")) is None


def test_a_change_is_far_smaller_than_the_list() -> None:
    """What the change is for: at 4,096 ranks, one node's loss costs a few bytes per member, not the list."""
    old = tuple(f"node{i:04d}-0" for i in range(4096))
    diff = ranks_change(Generation(1, old, None, "x"), Generation(2, old[1:], None, "y"))
    assert diff is not None
    change, whole = _assign(2, 5, **diff), _assign(2, 5, ranks=list(old[1:]))
    assert len(encode_frame(change)) * 100 < len(encode_frame(whole))


def test_a_change_against_the_wrong_generation_is_refused() -> None:
    change = _assign(5, 0, since=4, left=["b"], joined=[])
    with pytest.raises(ProtocolError, match="change since 4; this worker knows generation 3"):
        change.resolved(_assign(3, 0, ranks=["a", "b"]))
    with pytest.raises(ProtocolError, match="knows none"):
        change.resolved(None)


def test_a_change_that_does_not_give_the_rank_is_refused() -> None:
    with pytest.raises(ProtocolError, match="does not give rank 2"):
        _assign(5, 2, since=4, left=["b"], joined=[]).resolved(_assign(4, 0, ranks=["a", "b"]))
    with pytest.raises(ProtocolError, match="unique"):
        _assign(5, 0, since=4, left=[], joined=["a"]).resolved(_assign(4, 0, ranks=["a", "b"]))


@pytest.mark.parametrize(
    "fields",
    [
        {},  # neither
        {"ranks": ["a"], "since": 1},  # both
        {"since": 7, "left": ["a"]},  # a change since a later generation
    ],
)
def test_an_assign_is_whole_or_a_change(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"whole ranks|cannot be a change"):
        _assign(5, 0, **fields)
