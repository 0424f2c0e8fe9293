"""How a dropped loop was dropped (`usage.left_by_statement`): a `break` or a `return` out of the for
statement, told from an exception unwinding through it, by the frame that dropped the generator."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import FrameType

from slurm_elastic.worker.usage import left_by_statement


def watched(seen: list[bool]) -> Iterator[int]:
    try:
        yield from range(10)
    except GeneratorExit:
        seen.append(left_by_statement(sys._getframe(1)))
        raise


def by_break(seen: list[bool]) -> None:
    for i in watched(seen):
        if i == 2:
            break


def by_return(seen: list[bool]) -> int:
    for i in watched(seen):
        if i == 3:
            return i
    return -1


def by_exception(seen: list[bool]) -> None:
    for i in watched(seen):
        if i == 1:
            raise ValueError("boom")


def test_a_break_and_a_return_are_statements_and_an_exception_is_not() -> None:
    seen: list[bool] = []
    by_break(seen)
    by_return(seen)
    with contextlib.suppress(ValueError):
        by_exception(seen)
    assert seen == [True, True, False]


def test_an_unknown_frame_is_not_a_statement() -> None:
    frame: FrameType | None = None
    assert left_by_statement(frame) is False
