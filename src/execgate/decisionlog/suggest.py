"""``execgate rules suggest``: allow rules that would have saved the questions humans answered.

From every prompt a person answered (terminal, elicitation, ``execgate approvals``): the
commands allowed and the commands declined, as the rule that asked names the program. A
candidate is a prefix of an allowed command, at least as long as the prefix of the rule that
asked (a shorter allow would not settle that prompt, docs/policy.md "Approvals"). It must not
cover any declined command and must not be a banned prefix (Codex's list: an interpreter, a
shell's ``-c``, ``env``, ``sudo``, ``git`` …). Greedily, the candidate saving the most questions
is taken, the longest (narrowest) of those that tie, until none saves ``min_count``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from execgate.decisionlog.query import HUMANS, exec_command
from execgate.policy import allow_rule_line
from execgate.policy.banned import is_banned_prefix


@dataclass(frozen=True)
class Suggestion:
    prefix: tuple[str, ...]
    saves: int  # answered questions it would have saved
    example: tuple[str, ...]

    def rules_text(self) -> str:
        from execgate.visible import command_line

        plural = "s" if self.saves != 1 else ""
        line = allow_rule_line(self.prefix)
        if not line.isprintable():  # printed on a terminal: hidden characters as \u escapes,
            # which the rules language reads back as the same characters
            pattern = ", ".join(json.dumps(token) for token in self.prefix)
            line = f'prefix_rule(pattern=[{pattern}], decision="allow")'
        return (
            f"# saves {self.saves} question{plural}, e.g. {command_line(self.example, 200)}\n{line}"
        )


def _tokens(record: dict[str, Any]) -> tuple[tuple[str, ...], int]:
    """The command as rules name it (the asking rule's program token first) and the shortest
    prefix length that settles its prompt."""
    command = exec_command(record)
    prefix = [str(w) for w in record.get("prefix", [])]
    first = prefix[0] if prefix else posixpath.basename(command[0])
    return (first, *command[1:]), max(1, len(prefix))


def suggest(records: Iterable[dict[str, Any]], *, min_count: int = 2) -> list[Suggestion]:
    allowed: list[tuple[tuple[str, ...], int]] = []
    declined: list[tuple[str, ...]] = []
    for record in records:
        if "answer" not in record or record.get("answered_by") not in HUMANS:
            continue
        tokens, shortest = _tokens(record)
        if record["answer"] == "deny":
            declined.append(tokens)
        else:
            allowed.append((tokens, shortest))
    suggestions = []
    remaining = list(allowed)
    while remaining:
        best = _best(remaining, declined)
        if best is None or best.saves < min_count:
            break
        suggestions.append(best)
        remaining = [(t, n) for t, n in remaining if not _starts(t, best.prefix)]
    return suggestions


def _starts(tokens: Sequence[str], prefix: Sequence[str]) -> bool:
    return len(tokens) >= len(prefix) and tuple(tokens[: len(prefix)]) == tuple(prefix)


def _best(
    allowed: list[tuple[tuple[str, ...], int]], declined: list[tuple[str, ...]]
) -> Suggestion | None:
    candidates: dict[tuple[str, ...], tuple[str, ...]] = {}
    for tokens, shortest in allowed:
        for k in range(shortest, len(tokens) + 1):
            candidates.setdefault(tokens[:k], tokens)
    best: Suggestion | None = None
    for prefix, example in candidates.items():
        if is_banned_prefix(prefix) or any(not w.strip() for w in prefix):
            continue
        if any(_starts(d, prefix) for d in declined):
            continue
        # it settles a prompt only when at least as long as the rule that asked
        saves = sum(1 for t, n in allowed if len(prefix) >= n and _starts(t, prefix))
        if best is None or (saves, len(prefix)) > (best.saves, len(best.prefix)):
            best = Suggestion(prefix, saves, example)
    return best
