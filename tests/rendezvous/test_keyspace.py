"""The rendezvous store's pure state machine: every call, its torch semantics, limits, and generation pruning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.rendezvous.keyspace import SHARED, Blocked, Call, Done, Failed, KeyValueState, Limits

pytestmark = pytest.mark.timeout(60)

P = "rdzv"


def state(**limits: int) -> KeyValueState:
    return KeyValueState(P, Limits(**limits))


def done(s: KeyValueState, call: Call) -> Done:
    outcome = s.apply(call)
    assert isinstance(outcome, Done), outcome
    return outcome


def failed(s: KeyValueState, call: Call) -> str:
    outcome = s.apply(call)
    assert isinstance(outcome, Failed), outcome
    return outcome.error


def test_set_then_get() -> None:
    s = state()
    assert done(s, Call("set", ("rdzv/g1/0",), (b"addr",))).written == ("rdzv/g1/0",)
    assert done(s, Call("get", ("rdzv/g1/0",))).values == (b"addr",)
    assert done(s, Call("set", ("rdzv/g1/0",), (b"new",))).written == ("rdzv/g1/0",)
    assert done(s, Call("get", ("rdzv/g1/0",))).values == (b"new",) and s.count == 1


def test_blocking_calls_block_on_the_missing_keys_only() -> None:
    s = state()
    done(s, Call("set", ("a",), (b"1",)))
    assert s.apply(Call("get", ("b",))) == Blocked(("b",))
    assert s.apply(Call("wait", ("a", "b", "c"))) == Blocked(("b", "c"))
    assert s.apply(Call("multi_get", ("b", "a"))) == Blocked(("b",))
    assert done(s, Call("wait", ("a",))) == Done()
    done(s, Call("multi_set", ("b", "c"), (b"2", b"3")))
    assert done(s, Call("multi_get", ("c", "a", "b"))).values == (b"3", b"1", b"2")
    assert done(s, Call("wait", ("a", "b", "c"))) == Done()


def test_add_counts_from_zero_and_keeps_decimal_text() -> None:
    s = state()
    assert done(s, Call("add", ("n",), amount=1)).number == 1
    assert done(s, Call("add", ("n",), amount=5)).number == 6
    assert done(s, Call("add", ("n",), amount=-7)).number == -1
    assert done(s, Call("get", ("n",))).values == (b"-1",)
    assert done(s, Call("add", ("n",), amount=0)).written == ("n",)


def test_add_refuses_a_value_that_is_not_a_counter_and_overflow() -> None:
    s = state()
    done(s, Call("set", ("x",), (b"\xffabc",)))
    assert failed(s, Call("add", ("x",), amount=1)) == "store add: the value of 'x' is not an integer"
    done(s, Call("set", ("big",), (str(2**63 - 1).encode(),)))
    assert "overflows a 64-bit counter" in failed(s, Call("add", ("big",), amount=1))
    assert done(s, Call("get", ("big",))).values == (str(2**63 - 1).encode(),)


def test_compare_set_follows_torch() -> None:
    s = state()
    # missing key, expected non-empty: nothing set, the expected value comes back
    assert done(s, Call("compare_set", ("k",), (b"old", b"new"))) == Done(values=(b"old",))
    assert s.count == 0
    # missing key, expected empty: set
    assert done(s, Call("compare_set", ("k",), (b"", b"v1"))) == Done(values=(b"v1",), written=("k",))
    # present and equal: swapped
    assert done(s, Call("compare_set", ("k",), (b"v1", b"v2"))) == Done(values=(b"v2",), written=("k",))
    # present and different: the current value comes back, nothing written
    assert done(s, Call("compare_set", ("k",), (b"v1", b"v3"))) == Done(values=(b"v2",))


def test_check_delete_num_keys_list_keys_append() -> None:
    s = state()
    assert done(s, Call("check", ("a",))).number == 0
    done(s, Call("append", ("a",), (b"x",)))
    done(s, Call("append", ("a",), (b"yz",)))
    assert done(s, Call("get", ("a",))).values == (b"xyz",)
    done(s, Call("set", ("rdzv/g2/b",), (b"1",)))
    assert done(s, Call("check", ("a", "rdzv/g2/b"))).number == 1
    assert done(s, Call("check", ("a", "c"))).number == 0
    assert done(s, Call("num_keys")).number == 2
    assert sorted(done(s, Call("list_keys")).values) == [b"a", b"rdzv/g2/b"]
    assert done(s, Call("delete_key", ("a",))) == Done(number=1)
    assert done(s, Call("delete_key", ("a",))) == Done(number=0)
    assert (s.count, s.total_bytes) == (1, len("rdzv/g2/b") + 1)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (Call("set", ("a",)), "store set takes 1 value(s), got 0"),
        (Call("set", ("a", "b"), (b"1",)), "store set takes 1 key(s), got 2"),
        (Call("get", ()), "store get takes 1 key(s), got 0"),
        (Call("compare_set", ("a",), (b"1",)), "store compare_set takes 2 value(s), got 1"),
        (Call("num_keys", ("a",)), "store num_keys takes 0 key(s), got 1"),
        (Call("multi_set", ("a", "b"), (b"1",)), "store multi_set got 2 keys but 1 values"),
        (Call("wait", ("a",), (b"1",)), "store wait takes 0 value(s), got 1"),
    ],
)
def test_malformed_calls_fail_and_say_why(call: Call, error: str) -> None:
    assert state().apply(call) == Failed(error)


def test_limits_on_keys_values_and_bytes() -> None:
    s = state(max_keys=2, max_value_bytes=10, max_total_bytes=20, max_key_bytes=8)
    assert failed(s, Call("set", ("k" * 9,), (b"",))).endswith("exceeds the limit of 8 bytes")
    assert failed(s, Call("set", ("a",), (b"x" * 11,))) == "store set: a value of 11 bytes exceeds the limit of 10"
    done(s, Call("set", ("a",), (b"1",)))
    done(s, Call("set", ("b",), (b"1",)))
    assert failed(s, Call("set", ("c",), (b"1",))) == "store is full: 2 keys, the limit is 2"
    done(s, Call("set", ("a",), (b"x" * 10,)))  # overwriting an existing key adds no key
    assert s.total_bytes == 13
    assert failed(s, Call("set", ("b",), (b"y" * 10,))) == "store is full: 13 + 9 bytes exceeds the limit of 20"
    assert s.lookup("b") == b"1" and s.total_bytes == 13
    assert failed(s, Call("add", ("c",), amount=1)) == "store is full: 2 keys, the limit is 2"
    assert failed(s, Call("append", ("c",), (b"1",))) == "store is full: 2 keys, the limit is 2"
    done(s, Call("delete_key", ("b",)))
    assert done(s, Call("add", ("c",), amount=1)).number == 1


def test_multi_set_is_all_or_nothing() -> None:
    s = state(max_keys=2)
    done(s, Call("set", ("a",), (b"1",)))
    assert "store is full" in failed(s, Call("multi_set", ("b", "c"), (b"2", b"3")))
    assert s.count == 1 and s.lookup("b") is None
    done(s, Call("multi_set", ("b", "b"), (b"2", b"3")))  # the same key twice: the last value, one key
    assert s.lookup("b") == b"3" and s.count == 2


def test_namespaces() -> None:
    s = state()
    assert s.namespace("rdzv/g3/0/1") == 3
    assert s.namespace("rdzv/g12/state-meta") == 12
    for key in ("rdzv/gx/1", "rdzv/g3", "other/g3/1", "g3/1", "xrdzv/g3/1", "exception_dump"):
        assert s.namespace(key) is SHARED


def test_prune_drops_older_generations_and_refuses_their_keys() -> None:
    s = state()
    for g in (1, 2, 3):
        done(s, Call("set", (f"rdzv/g{g}/0",), (b"x" * g,)))
    done(s, Call("set", ("shared",), (b"s",)))
    assert s.prune(3) == [1, 2]
    assert (s.count, s.total_bytes) == (2, len("rdzv/g3/0") + 3 + len("shared") + 1)
    assert sorted(map(str, s.namespaces())) == ["3", "shared"]
    error = failed(s, Call("set", ("rdzv/g2/0",), (b"late",)))
    assert error == (
        "store key 'rdzv/g2/0' belongs to generation 2, which is over (the store holds generation 3 and later)"
    )
    assert "generation 1, which is over" in failed(s, Call("get", ("rdzv/g1/0",)))
    assert "generation 2" in failed(s, Call("wait", ("rdzv/g3/0", "rdzv/g2/1")))
    assert s.prune(2) == [] and s.floor == 3  # never backwards
    assert done(s, Call("get", ("rdzv/g3/0",))).values == (b"xxx",)


def gloo_like_generation(s: KeyValueState, g: int, world: int) -> None:
    """What one generation writes: each rank's address, a counter, and the state layout."""
    for rank in range(world):
        done(s, Call("set", (f"rdzv/g{g}/0/{rank}",), (b"a" * 200,)))
        done(s, Call("add", (f"rdzv/g{g}/barrier",), amount=1))
    done(s, Call("set", (f"rdzv/g{g}/state-meta",), (b"{}",)))


def test_key_count_after_100_generations_equals_that_after_5() -> None:
    s = state()
    seen = {}
    for g in range(1, 101):
        s.prune(g)  # the coordinator announces g
        gloo_like_generation(s, g, world=4 if g % 2 else 3)
        seen[g] = (s.count, s.total_bytes)
    # The same world size, the same keys: only the generation's digits in each key name differ.
    assert seen[100][0] == seen[6][0] == 5 and seen[99][0] == seen[5][0] == 6
    assert seen[100][1] - seen[6][1] == 2 * 5 and seen[99][1] - seen[5][1] == 1 * 6
    assert max(c for c, _ in seen.values()) == 6  # never more than one generation's keys


# --- properties: counts and bytes always match the keys held, reads return what was last written ---------

keys = st.sampled_from(["a", "b", "rdzv/g1/x", "rdzv/g2/x", "rdzv/g2/y", "rdzv/g3/x"])
calls = st.one_of(
    st.builds(lambda k, v: ("set", k, v), keys, st.binary(max_size=12)),
    st.builds(lambda k: ("delete_key", k, b""), keys),
    st.builds(lambda k, v: ("append", k, v), keys, st.binary(max_size=4)),
    st.builds(lambda g: ("prune", str(g), b""), st.integers(0, 4)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(calls, max_size=40))
def test_bookkeeping_matches_a_plain_dict(ops: list[tuple[str, str, bytes]]) -> None:
    s = state(max_keys=4, max_total_bytes=60)
    model: dict[str, bytes] = {}
    for op, key, value in ops:
        if op == "prune":
            s.prune(int(key))
            model = {k: v for k, v in model.items() if not (isinstance(g := s.namespace(k), int) and g < s.floor)}
            continue
        outcome = s.apply(Call(op, (key,), (value,) if op != "delete_key" else ()))  # type: ignore[arg-type]
        if isinstance(outcome, Done):
            if op == "set":
                model[key] = value
            elif op == "append":
                model[key] = model.get(key, b"") + value
            else:
                model.pop(key, None)
        assert s.count == len(model) <= 4
        assert s.total_bytes == sum(len(k) + len(v) for k, v in model.items()) <= 60
        for k in model:
            assert s.lookup(k) == model[k]
