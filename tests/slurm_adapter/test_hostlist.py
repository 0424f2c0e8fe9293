from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.errors import SlurmParseError
from slurm_elastic.slurm.hostlist import compress_hostlist, expand_hostlist, hostname_sort_key


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("gpu[01-03,10]", ["gpu01", "gpu02", "gpu03", "gpu10"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("localhost", ["localhost"]),
        ("", []),
        ("  n1  ", ["n1"]),
        ("n[9-10]", ["n9", "n10"]),
        ("n[5]", ["n5"]),
    ],
)
def test_expand_examples(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize(
    "expr", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[]", "n[[1]]", "a,,b", "n[1-2] n3", "n[1-", "]n"]
)
def test_expand_rejects_with_one_line_message_quoting_input(expr: str) -> None:
    with pytest.raises(SlurmParseError) as err:
        expand_hostlist(expr)
    assert repr(expr) in str(err.value)
    assert "\n" not in str(err.value)


def test_expand_refuses_huge_ranges() -> None:
    with pytest.raises(SlurmParseError, match="larger than"):
        expand_hostlist("n[1-100000000]")


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
        (["n3", "n1", "n2", "n2"], "n[1-3]"),
        (["gpu01", "gpu02", "gpu10"], "gpu[01-02,10]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n09", "n10"], "n[09-10]"),
        (["login", "n2", "n1"], "login,n[1-2]"),
        (["n1-ib", "n2-ib", "n1"], "n1,n[1-2]-ib"),
        (["n5"], "n5"),
        ([], ""),
    ],
)
def test_compress_examples(names: list[str], expr: str) -> None:
    assert compress_hostlist(names) == expr


@pytest.mark.parametrize("bad", ["", "n[1]", "a,b", "has space"])
def test_compress_rejects_bad_names(bad: str) -> None:
    with pytest.raises(SlurmParseError, match="invalid host name"):
        compress_hostlist([bad])


def test_sort_key_is_numeric() -> None:
    assert sorted(["n10", "n9", "m1", "n1"], key=hostname_sort_key) == ["m1", "n1", "n9", "n10"]


_prefix = st.text(alphabet="abcxyz-", min_size=0, max_size=3).filter(lambda p: not p[-1:].isdigit())
_suffix = st.sampled_from(["", "-ib", ".x"])
_number = st.tuples(st.integers(0, 120), st.integers(0, 3)).map(lambda t: str(t[0]).zfill(t[1] or 1))


@st.composite
def host_names(draw: st.DrawFn) -> str:
    prefix = draw(_prefix)
    if draw(st.booleans()):
        return prefix + draw(_number) + draw(_suffix)
    return prefix or "login"


@given(st.lists(host_names(), max_size=40))
@settings(max_examples=300, deadline=None)
def test_expand_of_compress_is_sorted_unique(names: list[str]) -> None:
    assert expand_hostlist(compress_hostlist(names)) == sorted(set(names), key=hostname_sort_key)


@st.composite
def hostlist_exprs(draw: st.DrawFn) -> str:
    tokens = []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(st.sampled_from(["n", "gpu", "r1n", "a-"]))
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            lo = draw(st.integers(0, 50))
            hi = lo + draw(st.integers(0, 5))
            width = draw(st.integers(1, 3))
            lo_s = str(lo).zfill(width)
            ranges.append(lo_s if hi == lo else f"{lo_s}-{hi}")
        tokens.append(f"{prefix}[{','.join(ranges)}]{draw(_suffix)}")
    return ",".join(tokens)


@given(hostlist_exprs())
@settings(max_examples=300, deadline=None)
def test_compress_of_expand_round_trips_as_a_set(expr: str) -> None:
    names = expand_hostlist(expr)
    assert set(expand_hostlist(compress_hostlist(names))) == set(names)
