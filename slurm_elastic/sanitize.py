"""Text shown to a person, made harmless: control characters become visible escapes.

Peers, workers and the user's training code all put text into what an operator reads (`status`, log
lines, error messages): a stderr tail, a reason, a worker id. A terminal acts on some of their characters
(ESC starts a sequence that can clear the screen, retitle the window, or fake a line of output; a bare
carriage return overwrites what came before; bidirectional controls reorder what is shown), so every such
character is replaced by its escape (`\\x1b`, `\\u202e`): the text stays readable and nothing acts on it.
Escaping ESC alone disarms every escape sequence, whatever follows it. JSON output escapes what it must on
its own and keeps the raw value for tools.
"""

from __future__ import annotations

__all__ = ["printable", "printable_lines"]

# Bidirectional embeddings, overrides and isolates, the Arabic letter mark, and the line and paragraph
# separators: format characters a terminal may honour, to reorder or break what it shows.
_FORMAT_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_SURROGATES = range(0xD800, 0xE000)  # never valid alone: printing one raises instead of showing it
# C0 (U+0000-U+001F), DEL, C1 (U+0080-U+009F): every character of Unicode's category Cc.
_CONTROLS = (*range(0x20), *range(0x7F, 0xA0))


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ONE_LINE = {code: _escape(code) for code in (*_CONTROLS, *_FORMAT_CONTROLS, *_SURROGATES)}
_LINES = {code: text for code, text in _ONE_LINE.items() if chr(code) not in "\n\t"}


def printable(text: str) -> str:
    """`text` on one line, with every control character (newline and tab included) escaped."""
    return text.translate(_ONE_LINE)


def printable_lines(text: str) -> str:
    """`text` with every control character escaped except newline and tab (a multi-line message, a
    traceback): carriage returns, ESC and the rest are shown, never acted on."""
    return text.translate(_LINES)
