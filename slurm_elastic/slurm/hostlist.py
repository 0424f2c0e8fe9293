"""Slurm hostlist expressions (`n[1-3,7]`, `gpu[01-10]`, `r[1-2]n[1-2]`): pure expand and compress."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from slurm_elastic.errors import SlurmParseError

__all__ = ["compress_hostlist", "expand_hostlist", "hostname_sort_key"]

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
# The last run of digits in a name is the one that compression folds into a range, as Slurm does.
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")
_FORBIDDEN = set("[],") | {" ", "\t", "\n"}
# A guard against a typo like n[1-100000000] eating the machine's memory.
_MAX_HOSTS = 1_000_000


def _fail(expr: str, why: str) -> SlurmParseError:
    return SlurmParseError(f"invalid hostlist {expr!r}: {why}")


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise _fail(expr, "nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _fail(expr, "']' without '['")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise _fail(expr, "'[' without ']'")
    parts.append(expr[start:])
    return parts


def _expand_ranges(expr: str, body: str) -> list[str]:
    """`1-3,07` -> ['1', '2', '3', '07']; each range keeps the width of its lower bound."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if m is None:
            raise _fail(expr, f"bad range {item!r} in brackets")
        lo_s, hi_s = m.group(1), m.group(2)
        lo = int(lo_s)
        hi = int(hi_s) if hi_s is not None else lo
        if hi < lo:
            raise _fail(expr, f"range {item!r} runs backwards")
        if hi - lo >= _MAX_HOSTS:
            raise _fail(expr, f"range {item!r} is larger than {_MAX_HOSTS} hosts")
        width = len(lo_s)
        out.extend(str(v).zfill(width) for v in range(lo, hi + 1))
    return out


def _expand_one(expr: str, token: str) -> list[str]:
    """Expand one comma-free token; several bracket groups form a cartesian product, first one outermost."""
    pieces: list[list[str]] = []
    pos = 0
    while pos < len(token):
        open_at = token.find("[", pos)
        if open_at < 0:
            pieces.append([token[pos:]])
            break
        close_at = token.find("]", open_at)
        if close_at < 0:
            raise _fail(expr, "'[' without ']'")
        pieces.append([token[pos:open_at]])
        body = token[open_at + 1 : close_at]
        if not body:
            raise _fail(expr, "empty brackets")
        pieces.append(_expand_ranges(expr, body))
        pos = close_at + 1
    names = ["".join(combo) for combo in itertools.product(*pieces)]
    if len(names) > _MAX_HOSTS:
        raise _fail(expr, f"more than {_MAX_HOSTS} hosts")
    return names


def expand_hostlist(expr: str) -> list[str]:
    """All host names of a Slurm hostlist expression, in Slurm's order (duplicates kept).

    An empty expression (a pending job's node list) expands to no hosts.
    """
    if not isinstance(expr, str):
        raise SlurmParseError(f"invalid hostlist {expr!r}: not a string")
    text = expr.strip()
    if not text:
        return []
    if any(ch.isspace() for ch in text):
        raise _fail(expr, "contains whitespace")
    names: list[str] = []
    for token in _split_top_level(text):
        if not token:
            raise _fail(expr, "empty host name between commas")
        if token.startswith("]"):
            raise _fail(expr, "']' without '['")
        names.extend(_expand_one(expr, token))
    return names


def hostname_sort_key(name: str) -> tuple[str, str, int, str]:
    """Order names by prefix, suffix, then the number in them (`n2` before `n10`)."""
    m = _LAST_NUMBER.match(name)
    if m is None:
        return (name, "", -1, "")
    prefix, digits, suffix = m.groups()
    return (prefix, suffix, int(digits), digits)


def _ranges(prefix: str, suffix: str, numbered: list[tuple[int, str]]) -> str:
    """Fold (value, digits) pairs, sorted, into `prefix[a-b,c]suffix` (or a plain name for one host)."""
    parts: list[str] = []
    i = 0
    while i < len(numbered):
        _lo_value, lo_digits = numbered[i]
        width = len(lo_digits)
        j = i
        # Extend while the next number is consecutive and prints the same at this range's width.
        while j + 1 < len(numbered):
            value, digits = numbered[j + 1]
            if value != numbered[j][0] + 1 or str(value).zfill(width) != digits:
                break
            j += 1
        parts.append(lo_digits if j == i else f"{lo_digits}-{numbered[j][1]}")
        i = j + 1
    if len(numbered) == 1:
        return f"{prefix}{numbered[0][1]}{suffix}"
    return f"{prefix}[{','.join(parts)}]{suffix}"


def compress_hostlist(names: Iterable[str]) -> str:
    """The shortest usual Slurm form of a set of names: grouped by prefix and suffix, padding kept.

    Names are sorted with `hostname_sort_key` and duplicates dropped, so
    `expand_hostlist(compress_hostlist(names))` is the sorted unique list.
    """
    unique: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name or any(ch in _FORBIDDEN for ch in name):
            raise SlurmParseError(f"invalid host name {name!r}: empty or contains '[', ']', ',' or a space")
        unique.add(name)
    ordered = sorted(unique, key=hostname_sort_key)
    out: list[str] = []
    group: list[tuple[int, str]] = []
    group_key: tuple[str, str] | None = None
    for name in ordered:
        prefix, suffix, value, digits = hostname_sort_key(name)
        if value < 0:
            if group_key is not None:
                out.append(_ranges(*group_key, group))
                group, group_key = [], None
            out.append(name)
            continue
        if group_key != (prefix, suffix):
            if group_key is not None:
                out.append(_ranges(*group_key, group))
            group, group_key = [], (prefix, suffix)
        group.append((value, digits))
    if group_key is not None:
        out.append(_ranges(*group_key, group))
    return ",".join(out)
