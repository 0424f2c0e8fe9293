"""A failed worker's last words (`agent.last_lines`): bounded, and cut only at a line's start, so that the
report of a long traceback never begins in the middle of a word."""

from __future__ import annotations

from slurm_elastic.agent import last_lines


def test_a_short_output_is_kept_whole() -> None:
    text = "Traceback (most recent call last):\n  File 'x'\nValueError: boom\n"
    assert last_lines(text, 4000) == text


def test_a_long_output_is_cut_at_a_line_start_within_the_bound() -> None:
    text = "".join(f"line {i} of the output\n" for i in range(1000)) + "ValueError: boom\n"
    tail = last_lines(text, 100)
    assert len(tail) <= 100 and tail.startswith("line ") and tail.endswith("ValueError: boom\n")
    assert text.endswith(tail)


def test_one_long_line_is_cut_where_it_must_be() -> None:
    assert last_lines("x" * 500, 100) == "x" * 100
