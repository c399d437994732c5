"""Evaluating commands against a policy: Codex's matching semantics, indexed for speed.

Semantics (``codex execpolicy check`` 0.169): every rule whose pattern is a prefix of the command
matches, in load order; the strictest decision wins; no match means no decision. With host
executable resolution, and only when no rule matched the literal first token, the program token
is resolved to a normalised absolute path and rules keyed by its basename are tried, gated by
``host_executable`` path lists.
"""

from __future__ import annotations

import heapq
import json
import os
import pwd
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from execgate.policy.codex_text import render_command
from execgate.policy.model import Decision, NetworkRule, PrefixRule, RuleMatch, SourceLocation

_RANK = {Decision.ALLOW: 0, Decision.PROMPT: 1, Decision.FORBIDDEN: 2}


def normalize_absolute_path(path: str) -> str:
    """Lexical normalisation of an absolute path: no ``.``, ``..`` or repeated slashes."""
    parts: list[str] = []
    for part in path.split("/"):
        if not part or part == ".":
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _expand_home(token: str) -> str:
    # Codex expands `~`, `~/...` and `~user/...` before resolving a program path.
    if token == "~" or token.startswith("~/"):
        home = os.environ.get("HOME")
        if not home:
            try:
                home = pwd.getpwuid(os.getuid()).pw_dir
            except KeyError:
                return token
        return home + token[1:]
    if token.startswith("~"):
        name, sep, rest = token[1:].partition("/")
        try:
            return pwd.getpwnam(name).pw_dir + sep + rest
        except (KeyError, ValueError):
            return token
    return token


def resolve_program_path(token: str, cwd: str | None = None) -> str:
    """The normalised absolute path a program token names, relative ones against ``cwd``."""
    path = _expand_home(token)
    if not path.startswith("/"):
        base = os.getcwd() if cwd is None else cwd
        if not base.startswith("/"):
            base = os.path.join(os.getcwd(), base)
        path = base + "/" + path
    return normalize_absolute_path(path)


def program_basename(path: str) -> str | None:
    """Last component of a normalised absolute path; ``None`` for ``/``."""
    name = path.rpartition("/")[2]
    return name or None


@dataclass(frozen=True, slots=True)
class _Bucket:
    """The rules of one program, pre-split by their second pattern position."""

    # Rules with no second position (they match any command starting with the program).
    short: tuple[PrefixRule, ...]
    # Second command token -> candidate rules in load order (short ones merged in).
    by_second: dict[str, tuple[PrefixRule, ...]]


def _build_bucket(rules: list[PrefixRule]) -> _Bucket:
    short = tuple(rule for rule in rules if not rule.rest)
    by_second: dict[str, list[PrefixRule]] = {}
    if not short:
        for rule in rules:
            for token in dict.fromkeys(rule.rest[0]):
                by_second.setdefault(token, []).append(rule)
        return _Bucket(short, {token: tuple(rs) for token, rs in by_second.items()})
    # Short rules match whatever the second token is: merge them in, keeping load order.
    positions: dict[str, list[int]] = {}
    short_positions = [i for i, rule in enumerate(rules) if not rule.rest]
    for i, rule in enumerate(rules):
        if rule.rest:
            for token in dict.fromkeys(rule.rest[0]):
                positions.setdefault(token, []).append(i)
    return _Bucket(
        short,
        {
            token: tuple(rules[i] for i in heapq.merge(indexes, short_positions))
            for token, indexes in positions.items()
        },
    )


@dataclass(frozen=True)
class Evaluation:
    """The result of evaluating one command."""

    command: tuple[str, ...]
    matches: list[RuleMatch]
    decision: Decision | None

    def to_check_json(self, pretty: bool = False) -> str:
        """Exactly what ``codex execpolicy check`` prints (without the trailing newline)."""
        rendered: list[dict[str, Any]] = []
        for match in self.matches:
            body: dict[str, Any] = {
                "matchedPrefix": list(match.matched_prefix),
                "decision": match.decision.value,
            }
            if match.resolved_program is not None:
                body["resolvedProgram"] = match.resolved_program
            if match.justification is not None:
                body["justification"] = match.justification
            rendered.append({"prefixRuleMatch": body})
        output: dict[str, Any] = {"matchedRules": rendered}
        if self.decision is not None:
            output["decision"] = self.decision.value
        if pretty:
            return json.dumps(output, ensure_ascii=False, indent=2)
        return json.dumps(output, ensure_ascii=False, separators=(",", ":"))

    def most_specific(self, decision: Decision) -> RuleMatch | None:
        """The match with that decision and the longest prefix (the last one on ties, as Codex)."""
        best: RuleMatch | None = None
        for match in self.matches:
            if match.decision is decision and (
                best is None or len(match.matched_prefix) >= len(best.matched_prefix)
            ):
                best = match
        return best

    def reason(self) -> str:
        """One sentence saying why, in Codex's words for prompt and forbidden decisions."""
        command = render_command(self.command)
        if self.decision is Decision.FORBIDDEN:
            match = self.most_specific(Decision.FORBIDDEN)
            if match is None:
                return f"`{command}` rejected: blocked by policy"
            if match.justification is not None:
                return f"`{command}` rejected: {match.justification}"
            prefix = render_command(match.matched_prefix)
            return f"`{command}` rejected: policy forbids commands starting with `{prefix}`"
        if self.decision is Decision.PROMPT:
            match = self.most_specific(Decision.PROMPT)
            if match is not None and match.justification is not None:
                return f"`{command}` requires approval: {match.justification}"
            return f"`{command}` requires approval by policy"
        if self.decision is Decision.ALLOW:
            match = self.most_specific(Decision.ALLOW)
            if match is not None and match.justification is not None:
                return f"`{command}` allowed: {match.justification}"
            return f"`{command}` allowed by policy"
        return f"`{command}` matches no rule"


@dataclass(frozen=True, eq=False)
class Policy:
    """An immutable set of rules, indexed by program (first token)."""

    rules: tuple[PrefixRule, ...] = ()
    network_rules: tuple[NetworkRule, ...] = ()
    host_executables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    _by_program: dict[str, list[PrefixRule]] = field(init=False, repr=False)
    # Built on first use: a warm start does not pay for programs it never sees.
    _buckets: dict[str, _Bucket] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        grouped: dict[str, list[PrefixRule]] = {}
        for rule in self.rules:
            bucket = grouped.get(rule.program)
            if bucket is None:
                grouped[rule.program] = [rule]
            else:
                bucket.append(rule)
        object.__setattr__(self, "_by_program", grouped)
        object.__setattr__(self, "_buckets", {})

    def build_index(self) -> Policy:
        """Index every program now instead of on first use (for long-lived servers)."""
        for program in self._by_program:
            self._bucket(program)
        return self

    def _bucket(self, program: str) -> _Bucket | None:
        bucket = self._buckets.get(program)
        if bucket is None:
            rules = self._by_program.get(program)
            if rules is None:
                return None
            # Concurrent first uses may both build it; the results are equal.
            bucket = self._buckets[program] = _build_bucket(rules)
        return bucket

    @classmethod
    def empty(cls) -> Policy:
        return cls()

    def first_tokens(self) -> frozenset[str]:
        """Every program some rule is keyed by.

        A command whose first token (or, with resolution, its path's basename) is not in this
        set has no match.
        """
        return frozenset(self._by_program)

    def extended(
        self,
        rules: Iterable[PrefixRule] = (),
        network_rules: Iterable[NetworkRule] = (),
        host_executables: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Policy:
        """A new policy with rules appended (later host_executable definitions win)."""
        merged_hosts = dict(self.host_executables)
        if host_executables:
            merged_hosts.update(host_executables)
        return Policy(
            self.rules + tuple(rules),
            self.network_rules + tuple(network_rules),
            merged_hosts,
        )

    def with_allow_prefix(
        self, tokens: Sequence[str], source: SourceLocation | None = None
    ) -> Policy:
        """The in-memory counterpart of an "always allow" amendment."""
        if not tokens:
            raise ValueError("prefix rule requires at least one token")
        rule = PrefixRule(
            program=tokens[0],
            rest=tuple((token,) for token in tokens[1:]),
            decision=Decision.ALLOW,
            source=source,
        )
        return self.extended([rule])

    def matches(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        resolve_host_executables: bool = False,
    ) -> list[RuleMatch]:
        """Every matching rule in load order."""
        if not command:
            return []
        program = command[0]
        found = self._match_program(command, program, program, None)
        if found or not resolve_host_executables:
            return found
        path = resolve_program_path(program, cwd)
        basename = program_basename(path)
        if basename is None:
            return []
        allowed = self.host_executables.get(basename)
        if allowed is not None and path not in allowed:
            return []
        return self._match_program(command, basename, basename, path)

    def _match_program(
        self, command: Sequence[str], program: str, shown: str, resolved: str | None
    ) -> list[RuleMatch]:
        bucket = self._bucket(program)
        if bucket is None:
            return []
        candidates = (
            bucket.short if len(command) < 2 else bucket.by_second.get(command[1], bucket.short)
        )
        found: list[RuleMatch] = []
        for rule in candidates:
            rest = rule.rest
            n = len(rest)
            if len(command) <= n:
                continue
            for i in range(1, n):  # position 1 is already known to match via the index
                if command[i + 1] not in rest[i]:
                    break
            else:
                found.append(
                    RuleMatch(
                        (shown, *command[1 : n + 1]),
                        rule.decision,
                        rule.justification,
                        resolved,
                        rule,
                    )
                )
        return found

    def evaluate(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        resolve_host_executables: bool = False,
    ) -> Evaluation:
        found = self.matches(command, cwd=cwd, resolve_host_executables=resolve_host_executables)
        decision: Decision | None = None
        if found:
            decision = found[0].decision
            for match in found:
                if _RANK[match.decision] > _RANK[decision]:
                    decision = match.decision
        return Evaluation(tuple(command), found, decision)
