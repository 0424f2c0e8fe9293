"""The sanitiser of text shown to a person: every code point, and the attacks it is for."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

import pytest

from slurm_elastic.sanitize import printable, printable_lines

EVERY_CODE_POINT = "".join(map(chr, range(0x110000)))
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def acts_on_a_terminal(char: str) -> bool:
    """Control characters (C0, DEL, C1), lone surrogates, bidirectional and line-breaking format characters."""
    return unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp") or char in BIDI


def test_no_character_that_acts_on_a_terminal_is_left_in_one_line() -> None:
    shown = printable(EVERY_CODE_POINT)
    assert [hex(ord(c)) for c in set(shown) if acts_on_a_terminal(c)] == []
    assert "\n" not in shown and "\t" not in shown


def test_only_newline_and_tab_are_kept_across_lines() -> None:
    shown = printable_lines(EVERY_CODE_POINT)
    assert sorted(c for c in set(shown) if acts_on_a_terminal(c)) == ["\t", "\n"]


@pytest.mark.parametrize("sanitise", [printable, printable_lines])
def test_every_other_character_is_kept_as_it_is(sanitise: Callable[[str], str]) -> None:
    kept = "".join(c for c in EVERY_CODE_POINT if not acts_on_a_terminal(c))
    assert sanitise(kept) == kept


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, ünïcode, 日本語, emoji \U0001f600", "plain text, ünïcode, 日本語, emoji \U0001f600"),
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen: shown, not done
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # retitle the window (OSC ... BEL)
        ("\x9b31m", "\\x9b31m"),  # the 8-bit CSI (C1)
        ("ok\rFAKE", "ok\\x0dFAKE"),  # a carriage return overwriting the line
        ("a\x7fb\x00c", "a\\x7fb\\x00c"),
        ("user\u202egnp.exe", "user\\u202egnp.exe"),  # right-to-left override
        ("one\u2028two", "one\\u2028two"),
        ("\ud800", "\\ud800"),  # a lone surrogate would make print() raise
    ],
)
def test_escape_sequences_and_controls_are_shown_as_escapes(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable_lines(raw) == shown


def test_lines_keep_their_breaks_and_one_line_does_not() -> None:
    forged = "real\n2026-01-01 [info] job_finished\tok"
    assert printable(forged) == "real\\x0a2026-01-01 [info] job_finished\\x09ok"
    assert printable_lines(forged) == forged


def test_sanitising_twice_only_escapes_nothing_more() -> None:
    once = printable("\x1b[31m\n")
    assert printable(once) == once  # the escapes are plain characters
