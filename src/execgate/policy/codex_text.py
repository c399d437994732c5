"""Texts rendered byte for byte as Codex (Rust) renders them.

Codex splits example strings and quotes commands with the Rust ``shlex`` crate (1.3), and puts
Rust ``Debug`` renderings of rules into some error messages. Python's ``shlex`` differs from the
crate (comments, ``\\$`` inside double quotes, ``\\r``; quoting style), so both are rebuilt here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

# --- Rust `shlex` 1.3 -----------------------------------------------------------------------

_WORD_BREAKS = frozenset(" \t\n")


def shlex_split(text: str) -> list[str] | None:
    """``shlex::split``: POSIX-ish words; ``None`` when the text ends inside a quote or escape."""
    words: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch in _WORD_BREAKS:
            continue
        if ch == "#":  # a comment runs to the end of the line
            for skipped in chars:
                if skipped == "\n":
                    break
            continue
        word: list[str] = []
        while True:
            if ch == '"':
                if not _double_quoted(chars, word):
                    return None
            elif ch == "'":
                for quoted in chars:
                    if quoted == "'":
                        break
                    word.append(quoted)
                else:
                    return None
            elif ch == "\\":
                escaped = next(chars, None)
                if escaped is None:
                    return None
                if escaped != "\n":
                    word.append(escaped)
            elif ch in _WORD_BREAKS:
                break
            else:
                word.append(ch)
            following = next(chars, None)
            if following is None:
                break
            ch = following
        words.append("".join(word))
    return words


def _double_quoted(chars: Iterable[str], word: list[str]) -> bool:
    it = iter(chars)
    for ch in it:
        if ch == '"':
            return True
        if ch == "\\":
            escaped = next(it, None)
            if escaped is None:
                return False
            if escaped in '$`"\\':
                word.append(escaped)
            elif escaped != "\n":
                word.extend(("\\", escaped))
        else:
            word.append(ch)
    return False


_UNQUOTED_OK = frozenset("+-./:@]_0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_UNQUOTED, _SINGLE, _DOUBLE = 1, 2, 4


def _quoting_strategy(data: bytes) -> tuple[int, int]:
    ok = _SINGLE | _DOUBLE | _UNQUOTED
    i = 0
    if data[0] == 0x5E:  # a leading ^ only survives right after an opening single quote
        ok = _SINGLE
        i = 1
    while i < len(data):
        byte = data[i]
        current = ok
        if byte >= 0x80:
            current &= ~_UNQUOTED
        else:
            ch = chr(byte)
            if ch not in _UNQUOTED_OK:
                current &= ~_UNQUOTED
            if ch in "'^\\":
                current &= ~_SINGLE
            if ch in "`$!^":
                current &= ~_DOUBLE
        if current == 0:
            break
        ok = current
        i += 1
    if ok & _UNQUOTED:
        return i, _UNQUOTED
    return i, (_SINGLE if ok & _SINGLE else _DOUBLE)


def shlex_quote(word: str) -> str | None:
    """``shlex::try_quote``; ``None`` for words containing NUL (the crate refuses them)."""
    if not word:
        return "''"
    if "\0" in word:
        return None
    data = word.encode("utf-8", "surrogateescape")
    out = bytearray()
    while data:
        length, strategy = _quoting_strategy(data)
        chunk, data = data[:length], data[length:]
        if strategy == _UNQUOTED:
            if not out and not data:
                return word
            out += chunk
        elif strategy == _SINGLE:
            out += b"'" + chunk + b"'"
        else:
            out += b'"'
            for byte in chunk:
                if byte in b'$`"\\':
                    out.append(0x5C)
                out.append(byte)
            out += b'"'
    return out.decode("utf-8", "surrogateescape")


def shlex_join(words: Iterable[str]) -> str | None:
    """``shlex::try_join``: quoted words separated by one space; ``None`` if any has a NUL."""
    quoted = []
    for word in words:
        q = shlex_quote(word)
        if q is None:
            return None
        quoted.append(q)
    return " ".join(quoted)


def render_command(words: Iterable[str]) -> str:
    """How Codex renders a command in reasons: shlex-joined, or space-joined if that fails."""
    words = list(words)
    joined = shlex_join(words)
    return joined if joined is not None else " ".join(words)


# --- Rust `Debug` for strings ---------------------------------------------------------------

# Characters Rust's Debug escapes although Python calls them printable: Grapheme_Extend.
# Python has no such property; combining marks plus the Other_Grapheme_Extend extras we know.
_EXTRA_GRAPHEME_EXTEND = frozenset([0x200C, *range(0x1F3FB, 0x1F400), *range(0xE0020, 0xE0080)])


def _rust_escapes(ch: str) -> bool:
    if not ch.isprintable():
        return True
    code = ord(ch)
    if code < 0x300:
        return False
    return unicodedata.category(ch) in ("Mn", "Me") or code in _EXTRA_GRAPHEME_EXTEND


_RUST_SIMPLE_ESCAPES = {
    "\0": "\\0",
    "\t": "\\t",
    "\r": "\\r",
    "\n": "\\n",
    '"': '\\"',
    "\\": "\\\\",
}


def rust_debug_str(text: str) -> str:
    """``format!("{:?}", text)``."""
    out = ['"']
    for ch in text:
        simple = _RUST_SIMPLE_ESCAPES.get(ch)
        if simple is not None:
            out.append(simple)
        elif _rust_escapes(ch):
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def rust_debug_str_list(items: Iterable[str]) -> str:
    """``format!("{:?}", vec_of_strings)``."""
    return "[" + ", ".join(rust_debug_str(item) for item in items) + "]"


# --- starlark-rust value reprs in type errors -----------------------------------------------


def truncate_starlark_repr(text: str) -> str:
    """Starlark shortens reprs inside error messages: 34 bytes, ``<<...>>``, the last 17."""
    if len(text) <= 60:
        return text
    data = text.encode("utf-8")

    def boundary(index: int) -> int:
        while index < len(data) and (data[index] & 0xC0) == 0x80:
            index += 1
        return index

    head = data[: boundary(34)].decode("utf-8")
    tail = data[boundary(len(data) - 17) :].decode("utf-8")
    return f"{head}<<...>>{tail}"
