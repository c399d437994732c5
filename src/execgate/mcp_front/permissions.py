"""Permission requests: the model asks for more than the sandbox gives (``sandbox_permissions``).

``require_escalated`` asks the human to run the call's command outside the sandbox; its execs
stay gated (forbidden stays forbidden, prompts still ask). ``with_additional_permissions`` asks
for the sandbox widened by exactly the listed writable folders and/or network access.
``prefix_rule`` (only with ``require_escalated``) proposes the allow rule an "always" answer
appends; prefixes that would approve anything are refused (the reference's banned list).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from execgate.mcp_front.tool import ToolArgumentError, json_type
from execgate.policy.banned import is_banned_prefix
from execgate.sandbox import SandboxSpec
from execgate.visible import command_line, visible

USE_DEFAULT: Final = "use_default"
REQUIRE_ESCALATED: Final = "require_escalated"
WITH_ADDITIONAL: Final = "with_additional_permissions"
MODES: Final = (USE_DEFAULT, REQUIRE_ESCALATED, WITH_ADDITIONAL)

#: What the tools' input schemas gain.
SCHEMA_PROPERTIES: Final[dict[str, Any]] = {
    "sandbox_permissions": {
        "type": "string",
        "enum": list(MODES),
        "description": "use_default (the sandbox as configured), require_escalated (ask the "
        "user to run this command outside the sandbox; its programs stay gated), or "
        "with_additional_permissions (ask for the sandbox widened by additional_permissions).",
    },
    "justification": {
        "type": "string",
        "description": "Why the command needs more permissions (shown to the user).",
    },
    "additional_permissions": {
        "type": "object",
        "properties": {
            "writable_roots": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Extra folders to make writable (absolute paths).",
            },
            "network_access": {"type": "boolean", "description": "Allow network access."},
        },
        "additionalProperties": False,
    },
    "prefix_rule": {
        "type": "array",
        "items": {"type": "string"},
        "description": "With require_escalated only: a command prefix the user may approve "
        'for good ("always"), e.g. ["npm", "install"]; it must start every command of the call.',
    },
}


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    mode: str  # REQUIRE_ESCALATED or WITH_ADDITIONAL
    justification: str | None
    writable_roots: tuple[Path, ...] = ()
    network: bool = False
    prefix_rule: tuple[str, ...] = ()

    def asks_for(self) -> str:
        """What is asked, in words (for the human and the log)."""
        if self.mode == REQUIRE_ESCALATED:
            return "to run this command outside the sandbox (its programs stay gated)"
        parts = (
            [f"writable {', '.join(map(str, self.writable_roots))}"] if self.writable_roots else []
        )
        if self.network:
            parts.append("network access")
        return f"to run this command with the sandbox widened by {' and '.join(parts)}"

    def purpose(self) -> str:
        why = f": {visible(self.justification, 1000)}" if self.justification else ""
        rule = (
            f' (an "always" answer adds the rule prefix_rule({command_line(self.prefix_rule)}))'
            if self.prefix_rule
            else ""
        )
        return f"the agent asks {self.asks_for()}{why}{rule}"

    def session_key(self, command: str) -> tuple[object, ...]:
        """What an "allow for this session" answer covers: the same request for commands the
        proposed prefix starts (else the same command)."""
        scope: object = self.prefix_rule or command
        return (self.mode, self.writable_roots, self.network, scope)


def parse_permissions(
    arguments: Mapping[str, Any] | None, command: str, *, workdir: str
) -> PermissionRequest | None:
    """The call's permission request (None: ``use_default``); :class:`ToolArgumentError` says
    what is wrong, including a refused ``prefix_rule``."""
    arguments = arguments or {}
    mode = arguments.get("sandbox_permissions")
    if mode is None:
        mode = USE_DEFAULT
    if mode not in MODES:
        raise ToolArgumentError(
            f"`sandbox_permissions` must be one of {', '.join(MODES)}, got {json_type(mode)}"
        )
    justification = arguments.get("justification")
    if justification is not None and not isinstance(justification, str):
        raise ToolArgumentError(f"`justification` must be a string, got {json_type(justification)}")
    extra = arguments.get("additional_permissions")
    rule = arguments.get("prefix_rule")
    if extra is not None and mode != WITH_ADDITIONAL:
        raise ToolArgumentError(
            "`additional_permissions` needs `sandbox_permissions`: with_additional_permissions"
        )
    if rule is not None and mode != REQUIRE_ESCALATED:
        raise ToolArgumentError(
            "`prefix_rule` is honoured only with `sandbox_permissions`: require_escalated"
        )
    if mode == USE_DEFAULT:
        return None
    if mode == REQUIRE_ESCALATED:
        prefix = _prefix_rule(rule, command) if rule is not None else ()
        return PermissionRequest(mode, justification or None, prefix_rule=prefix)
    roots, network = _additional(extra, workdir)
    return PermissionRequest(mode, justification or None, writable_roots=roots, network=network)


def _additional(extra: object, workdir: str) -> tuple[tuple[Path, ...], bool]:
    if not isinstance(extra, dict):
        raise ToolArgumentError(
            "with_additional_permissions needs `additional_permissions`: an object with "
            "`writable_roots` (folders) and/or `network_access` (true)"
        )
    unknown = set(extra) - {"writable_roots", "network_access"}
    if unknown:
        raise ToolArgumentError(
            f"`additional_permissions` has unknown keys: {', '.join(sorted(unknown))} "
            "(known: writable_roots, network_access)"
        )
    raw_roots = extra.get("writable_roots") or []
    if not isinstance(raw_roots, list) or not all(isinstance(r, str) and r for r in raw_roots):
        raise ToolArgumentError("`additional_permissions.writable_roots` must be folder names")
    network = extra.get("network_access", False)
    if not isinstance(network, bool):
        raise ToolArgumentError("`additional_permissions.network_access` must be true or false")
    roots = []
    for raw in raw_roots:
        real = Path(os.path.realpath(os.path.join(workdir, os.path.expanduser(raw))))
        if not real.is_dir():
            raise ToolArgumentError(
                f"`additional_permissions.writable_roots`: {raw} is not a folder"
            )
        if real not in roots:
            roots.append(real)
    if not roots and not network:
        raise ToolArgumentError("`additional_permissions` asks for nothing")
    return tuple(roots), network


_OPERATORS = {";", "&", "&&", "||", "|", "|&", "(", ")", "\n"}


def _prefix_rule(rule: object, command: str) -> tuple[str, ...]:
    if not isinstance(rule, list) or not rule or not all(isinstance(t, str) and t for t in rule):
        raise ToolArgumentError("`prefix_rule` must be a non-empty array of words")
    prefix = tuple(rule)
    shown = command_line(prefix)
    if is_banned_prefix(prefix):
        raise ToolArgumentError(
            f"prefix_rule `{shown}` refused: a rule for it would approve any command (ask "
            "without prefix_rule, or propose a longer, more specific prefix)"
        )
    for words in _simple_commands(command):
        if tuple(words[: len(prefix)]) != prefix:
            raise ToolArgumentError(
                f"prefix_rule `{shown}` refused: it does not start every command of the call "
                f"(`{command_line(words, 200)}`)"
            )
    return prefix


def _simple_commands(command: str) -> list[list[str]]:
    """The simple commands of a plain command line; a line with substitutions, redirections
    or anything else this cannot follow is refused (a prefix rule must cover what runs)."""
    if any(c in command for c in "`$<>"):
        raise ToolArgumentError(
            "prefix_rule refused: the command uses substitutions or redirections, so which "
            "commands it runs cannot be checked against the rule"
        )
    lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _OPERATORS:
                commands.append([])
            else:
                commands[-1].append(token)
    except ValueError as exc:
        raise ToolArgumentError(f"prefix_rule refused: cannot read the command: {exc}") from None
    return [c for c in commands if c]


def widened(spec: SandboxSpec | None, request: PermissionRequest) -> SandboxSpec | None:
    """The sandbox an approved request runs in: none for require_escalated; else ``spec``
    widened by exactly the request's folders and network."""
    if request.mode == REQUIRE_ESCALATED or spec is None or not spec.confines:
        return None if request.mode == REQUIRE_ESCALATED else spec
    base = spec.writable_roots if spec.mode == "workspace-write" else ()
    roots = tuple(dict.fromkeys((*base, *request.writable_roots)))
    mode = "workspace-write" if roots else spec.mode
    network = spec.network or request.network
    # Approved network access is the whole network for this call: no proxy in between.
    proxy = spec.network_proxy and not network
    return replace(spec, mode=mode, writable_roots=roots, network=network, network_proxy=proxy)
