"""Prefixes no lasting "allow" rule may be: each would approve arbitrary code (an interpreter,
a shell's ``-c``, ``env``, ``sudo``, ``git`` …). Codex's list (codex-compat.md §4.3), used for
proposed ``prefix_rule``s (MCP permission requests) and ``execgate rules suggest``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

BANNED_PREFIXES: Final[frozenset[tuple[str, ...]]] = frozenset(
    tuple(words.split())
    for words in (
        "python3",
        "python3 -c",
        "python",
        "python -c",
        "bash",
        "bash -lc",
        "bash -c",
        "sh",
        "sh -c",
        "sh -lc",
        "zsh -lc",
        "zsh -c",
        "/bin/bash -lc",
        "/bin/bash -c",
        "/bin/sh -c",
        "/bin/zsh -lc",
        "env",
        "sudo",
        "node",
        "node -e",
        "perl -e",
        "ruby -e",
        "php -r",
        "lua -e",
        "osascript",
        "git",
        "pwsh",
        "pwsh -Command",
        "pwsh -c",
        "powershell",
        "powershell -Command",
        "powershell -c",
        "powershell.exe",
        "powershell.exe -Command",
    )
)


def is_banned_prefix(prefix: Sequence[str]) -> bool:
    """Whether ``prefix`` is banned, its program named by path or by name (``/usr/bin/env``)."""
    words = tuple(prefix)
    if not words:
        return True
    return words in BANNED_PREFIXES or (words[0].rsplit("/", 1)[-1], *words[1:]) in BANNED_PREFIXES
