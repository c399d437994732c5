"""The policy's plain data: decisions, prefix rules, network rules and matches.

Everything here is immutable and cheap to build, because a compiled policy is rebuilt from the
cache on every warm start.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from execgate.errors import ExecgateError


class Decision(enum.Enum):
    """What a rule says about a command. Ordered by strictness: ``ALLOW < PROMPT < FORBIDDEN``."""

    ALLOW = "allow"
    PROMPT = "prompt"
    FORBIDDEN = "forbidden"

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return _STRICTNESS[self] < _STRICTNESS[other]

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return _STRICTNESS[self] <= _STRICTNESS[other]

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return _STRICTNESS[self] > _STRICTNESS[other]

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return _STRICTNESS[self] >= _STRICTNESS[other]

    @classmethod
    def parse(cls, raw: str) -> Decision:
        """Codex's parser: exact, case-sensitive names."""
        try:
            return _BY_NAME[raw]
        except KeyError:
            raise ValueError(f"invalid decision: {raw}") from None


_STRICTNESS = {Decision.ALLOW: 0, Decision.PROMPT: 1, Decision.FORBIDDEN: 2}
_BY_NAME = {d.value: d for d in Decision}


class PolicyError(ExecgateError):
    """A rules (or requirements) file that cannot be used, located as precisely as known.

    ``str()`` is ``path:line:column: message`` (or less when the position is unknown), which is
    what the CLI prints after ``execgate: error:``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
        readable: str | None = None,
    ) -> None:
        self.reason = message
        self.path = path
        self.line = line
        self.column = column
        where = ":".join(str(p) for p in (path, line, column) if p is not None)
        #: Codex's words (``execgate check`` prints them, as ``codex execpolicy check`` does).
        self.codex_text = f"{where}: {message}" if where else message
        # Every other command says it in words meant for a person.
        shown = readable or _readable(message)
        super().__init__(f"{where}: {shown}" if where else shown)


def _readable(message: str) -> str:
    """Codex's message, with what a person needs to fix it added."""
    if message.startswith("invalid decision: "):
        return f"{message} (valid decisions: {', '.join(d.value for d in Decision)})"
    return message


class SourceLocation(NamedTuple):
    """Where a rule was defined: the file as it was named when loaded, 1-based line and column
    (0 when the source has no positions, e.g. a TOML requirements entry)."""

    path: str
    line: int
    column: int

    def __str__(self) -> str:
        if self.line <= 0:
            return self.path
        return f"{self.path}:{self.line}:{self.column}"


# One pattern position: the accepted tokens (a single token is a 1-tuple).
PatternToken = tuple[str, ...]

# The data classes below are NamedTuples rather than frozen dataclasses: equally immutable and
# typed, and several times cheaper to build -- a warm start builds 10,000 rules from the cache,
# and every evaluation builds its matches.


class PrefixRule(NamedTuple):
    """``prefix_rule`` after first-token expansion: one program, the remaining positions."""

    program: str
    rest: tuple[PatternToken, ...]
    decision: Decision
    justification: str | None = None
    # Accepted and kept for Codex compatibility; Codex's `execpolicy check` ignores it too.
    canonical_matching: bool = False
    source: SourceLocation | None = None

    @property
    def length(self) -> int:
        return len(self.rest) + 1

    def pattern_text(self) -> str:
        """Human rendering for listings: ``git [status|diff]``."""
        parts = [self.program]
        for accepted in self.rest:
            parts.append(accepted[0] if len(accepted) == 1 else "[" + "|".join(accepted) + "]")
        return " ".join(parts)


NETWORK_PROTOCOLS = ("http", "https", "socks5_tcp", "socks5_udp")


class NetworkRule(NamedTuple):
    """``network_rule``: parsed and validated; enforcement belongs to the sandbox."""

    host: str
    protocol: str  # one of NETWORK_PROTOCOLS
    decision: Decision
    justification: str | None = None
    source: SourceLocation | None = None


class RuleMatch(NamedTuple):
    """One rule that matched a command."""

    matched_prefix: tuple[str, ...]
    decision: Decision
    justification: str | None
    # The normalised absolute program path when the match came from basename resolution.
    resolved_program: str | None
    rule: PrefixRule

    @property
    def source(self) -> SourceLocation | None:
        return self.rule.source
