"""Text a human reads to decide: every character visible, nothing cut without saying so.

A command, a path or a process name comes from a gated process, which is an attacker. Terminal
escape sequences, carriage returns, newlines and bidirectional overrides inside it could make a
prompt read as another command than the one it asks about. Everything execgate shows a person
(terminal prompt, elicitation, ``execgate approvals list``, denial lines, logs) goes through
here. The C twin for the interposer's own denial lines is ``render_cmd`` in ``native/gate.c``.

Hidden characters are written the way bash's ``$'…'`` quoting reads them (``\\e``, ``\\n``,
``\\x7f``, ``\\u202e``), so a word that needs them is shown as a valid ``$'…'`` word; words
without them keep Codex's quoting (:func:`execgate.policy.codex_text.shlex_quote`).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable

from execgate.policy.codex_text import shlex_quote

# Control (C0, DEL, C1), format (bidi marks, overrides and isolates, zero-width characters),
# surrogates (bytes that were not UTF-8, as os.fsdecode gives them), line and paragraph
# separators: none of them may reach a terminal raw.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
    "\x1b": "\\e",
}


def is_hidden(ch: str) -> bool:
    """Whether ``ch`` must be shown escaped."""
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _clean(text: str) -> bool:
    # isprintable() is False for every hidden category (and for a few harmless ones, which
    # then take the slow path and come out unchanged).
    return text.isprintable()


def _cut_note(hidden: int) -> str:
    return f"… ({hidden} more character{'s' if hidden != 1 else ''})"


def visible(text: str, limit: int | None = None) -> str:
    """``text`` with every hidden character escaped; longer than ``limit`` characters (of
    output), cut with a note that says how many characters of ``text`` are not shown."""
    if _clean(text):
        if limit is None or len(text) <= limit:
            return text
        return text[:limit] + _cut_note(len(text) - limit)
    out: list[str] = []
    size = 0
    for index, ch in enumerate(text):
        piece = _escape(ch) if is_hidden(ch) else ch
        if limit is not None and size + len(piece) > limit:
            return "".join(out) + _cut_note(len(text) - index)
        out.append(piece)
        size += len(piece)
    return "".join(out)


def quote_word(word: str) -> str:
    """One word (an argument, a path, a process name) as a shell word a human can read."""
    if _clean(word):
        quoted = shlex_quote(word)
        if quoted is not None:
            return quoted
    body = "".join(
        _escape(ch) if is_hidden(ch) else "\\" + ch if ch in "\\'" else ch for ch in word
    )
    return f"$'{body}'"


def command_line(words: Iterable[str], limit: int | None = None) -> str:
    """A command as one line of quoted words; cut at ``limit`` characters with a note that
    says how many characters of that line are not shown."""
    words = list(words)
    shown: list[str] = []
    size = 0
    for index, word in enumerate(words):
        separator = " " if index else ""
        room = None if limit is None else limit - size - len(separator)
        quoted = quote_word(word[: room + 1] if room is not None and room >= 0 else word)
        if room is None or len(quoted) <= room:  # quoting never makes a word shorter
            shown.append(separator + quoted)
            size += len(separator) + len(quoted)
            continue
        kept = _longest_prefix(word, max(room, 0))
        if kept:
            shown.append(separator + quote_word(word[:kept]))
        # how much of the whole line is not shown (at least the quotes of an empty word)
        whole = len(" ".join(map(quote_word, words)))
        hidden = whole - len("".join(shown))
        return "".join(shown) + _cut_note(hidden)
    return "".join(shown)


def _longest_prefix(word: str, room: int) -> int:
    """The longest prefix of ``word`` whose quoted form fits in ``room`` characters."""
    low, high = 0, min(len(word), room)
    while low < high:
        middle = (low + high + 1) // 2
        if len(quote_word(word[:middle])) <= room:
            low = middle
        else:
            high = middle - 1
    return low


class VisibleFormatter(logging.Formatter):
    """A log formatter whose messages show hidden characters escaped (tracebacks keep their
    lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))
