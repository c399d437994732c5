"""A record's argument vector, bounded: one exec cannot flood the log. Its own module (no
asyncio, no logging); native/chain.c cuts the native front's first record alike (its
EG_WORD_LIMIT and EG_ARGV_LIMIT are these)."""

from __future__ import annotations

__all__ = ["ARGV_LIMIT", "WORD_LIMIT", "bounded_argv"]

#: Longest argument word kept in a record, and longest argument vector (characters).
WORD_LIMIT = 4096
ARGV_LIMIT = 65536


def bounded_argv(argv: list[str]) -> tuple[list[str], int]:
    """``argv`` cut to the record's limits, and how many characters were cut."""
    kept: list[str] = []
    total = cut = 0
    for word in argv:
        if total >= ARGV_LIMIT:
            cut += len(word)
            continue
        short = word[:WORD_LIMIT]
        cut += len(word) - len(short)
        kept.append(short)
        total += len(short)
    return kept, cut
