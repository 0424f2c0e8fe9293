from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.data import Cursor, SampleOrder
from slurm_elastic.errors import DataError

seeds = st.integers(min_value=0, max_value=2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=500),
    seed=seeds,
    shuffle=st.booleans(),
    steps=st.lists(st.integers(min_value=0, max_value=1200), max_size=25),
)
def test_stream_is_the_concatenation_of_epoch_permutations(n: int, seed: int, shuffle: bool, steps: list[int]) -> None:
    order = SampleOrder(n, seed, shuffle=shuffle)
    cursor = Cursor(0)
    consumed = []
    for size in steps:
        got = order.indices(cursor.position, size)
        assert got.dtype == np.int64 and got.shape == (size,)
        consumed.append(got)
        cursor = cursor.advance(size)
    stream = np.concatenate([np.empty(0, dtype=np.int64), *consumed])

    total = sum(steps)
    epochs = -(-total // n)
    reference = SampleOrder(n, seed, shuffle=shuffle)  # a fresh instance: no shared cache
    perms = [reference.permutation(e) for e in range(epochs)]
    for perm in perms:
        assert np.array_equal(np.sort(perm), np.arange(n))
    expected = np.concatenate([np.empty(0, dtype=np.int64), *perms])[:total]
    assert np.array_equal(stream, expected)
    assert cursor.position == total
    assert cursor.epoch(n) == order.epoch_of(total) == total // n


@settings(max_examples=50, deadline=None)
@given(n=st.integers(min_value=1, max_value=300), seed=seeds, start=st.integers(0, 5000), count=st.integers(0, 900))
def test_deterministic_across_instances_and_cache_states(n: int, seed: int, start: int, count: int) -> None:
    a = SampleOrder(n, seed)
    b = SampleOrder(n, seed)
    b.permutation(7)  # a different cached epoch must not change anything
    assert np.array_equal(a.indices(start, count), b.indices(start, count))
    assert np.array_equal(a.permutation(3), b.permutation(3))


@settings(max_examples=50, deadline=None)
@given(n=st.integers(min_value=10, max_value=500), seeds=st.lists(seeds, min_size=2, max_size=2, unique=True))
def test_different_seeds_give_different_orders(n: int, seeds: list[int]) -> None:
    first, second = (SampleOrder(n, s) for s in seeds)
    assert not np.array_equal(first.permutation(0), second.permutation(0))


def test_different_epochs_give_different_orders() -> None:
    order = SampleOrder(100, 5)
    assert not np.array_equal(order.permutation(0).copy(), order.permutation(1))


def test_order_is_pinned() -> None:
    # Literal values: a change here means checkpoints and running jobs would see a different order.
    order = SampleOrder(10, 0)
    assert order.permutation(0).tolist() == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    assert order.permutation(1).tolist() == [9, 1, 3, 8, 7, 6, 0, 4, 2, 5]
    assert SampleOrder(1000, 12345).indices(995, 10).tolist() == [985, 789, 222, 397, 413, 358, 942, 845, 70, 624]


def test_no_shuffle_is_the_identity_every_epoch() -> None:
    order = SampleOrder(4, 1, shuffle=False)
    assert order.indices(2, 7).tolist() == [2, 3, 0, 1, 2, 3, 0]


def test_epoch_of_and_crossing() -> None:
    order = SampleOrder(5, 3)
    assert [order.epoch_of(p) for p in (0, 4, 5, 9, 10)] == [0, 0, 1, 1, 2]
    crossing = order.indices(3, 4)
    assert crossing[:2].tolist() == order.permutation(0)[3:].tolist()
    assert crossing[2:].tolist() == order.permutation(1)[:2].tolist()


def test_count_zero_and_many_epochs() -> None:
    order = SampleOrder(3, 0)
    empty = order.indices(10, 0)
    assert empty.dtype == np.int64 and empty.size == 0
    many = order.indices(0, 3 * 50)
    assert np.array_equal(np.bincount(many), np.full(3, 50))


def test_permutation_is_read_only() -> None:
    perm = SampleOrder(8, 0).permutation(0)
    with pytest.raises(ValueError):
        perm[0] = 99


def test_single_sample() -> None:
    assert SampleOrder(1, 0).indices(5, 3).tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_samples": 0, "seed": 0}, "num_samples must be an integer >= 1, got 0"),
        ({"num_samples": -3, "seed": 0}, "num_samples must be an integer >= 1, got -3"),
        ({"num_samples": 2.5, "seed": 0}, r"num_samples must be an integer >= 1, got 2\.5"),
        ({"num_samples": True, "seed": 0}, "num_samples must be an integer >= 1, got True"),
        ({"num_samples": 5, "seed": -1}, "seed must be an integer >= 0, got -1"),
    ],
)
def test_constructor_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(DataError, match=match):
        SampleOrder(**kwargs)  # type: ignore[arg-type]


def test_argument_validation() -> None:
    order = SampleOrder(5, 0)
    with pytest.raises(DataError, match="start must be an integer >= 0, got -1"):
        order.indices(-1, 2)
    with pytest.raises(DataError, match="count must be an integer >= 0, got -2"):
        order.indices(0, -2)
    with pytest.raises(DataError, match="epoch must be an integer >= 0, got -1"):
        order.permutation(-1)
    with pytest.raises(DataError, match="position must be an integer >= 0, got -1"):
        order.epoch_of(-1)


def test_numpy_integers_are_accepted() -> None:
    order = SampleOrder(np.int64(6), np.uint32(2))  # type: ignore[arg-type]
    assert order.indices(np.int64(4), np.int32(3)).tolist() == SampleOrder(6, 2).indices(4, 3).tolist()  # type: ignore[arg-type]


def test_cursor_round_trip_and_arithmetic() -> None:
    cursor = Cursor(0).advance(7).advance(0).advance(5)
    assert cursor == Cursor(12)
    assert cursor.epoch(5) == 2
    wire = json.dumps(cursor.to_json())
    assert Cursor.from_json(json.loads(wire)) == cursor
    assert cursor.to_json() == {"position": 12}
    with pytest.raises(FrozenInstanceError):
        cursor.position = 3  # type: ignore[misc]


@pytest.mark.parametrize("bad", [None, [], {"position": -1}, {"position": "3"}, {"position": 1, "x": 2}, {}])
def test_cursor_from_json_rejects_garbage(bad: object) -> None:
    with pytest.raises(DataError, match="cursor"):
        Cursor.from_json(bad)


def test_cursor_validation() -> None:
    with pytest.raises(DataError, match="cursor position must be an integer >= 0, got -4"):
        Cursor(-4)
    with pytest.raises(DataError, match="count must be an integer >= 0, got -1"):
        Cursor(3).advance(-1)
    with pytest.raises(DataError, match="num_samples must be an integer >= 1, got 0"):
        Cursor(3).epoch(0)
