"""``execgate check``: the JSON of ``codex execpolicy check``, for given files or the layers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from execgate.cli.workdir import working_directory
from execgate.errors import ExecgateError
from execgate.policy import PolicyError, load_chosen_policy, load_layered_policy


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check",
        help="evaluate a command against rules files (Codex-compatible JSON)",
        description=(
            "Evaluate a command and print the JSON `codex execpolicy check` prints: every "
            "matching rule in load order and the strictest decision (omitted when nothing "
            "matches). With --rules, exactly those files in that order; without, the layered "
            "policy for the current directory; admin requirements apply on top of either. "
            "Exit status 0 for any evaluation (even forbidden), 1 when the rules cannot be "
            "loaded, 2 for usage errors."
        ),
        examples=[
            "execgate check -- git push origin main",
            "execgate check -r a.rules -r b.rules --pretty -- rm -rf /tmp/x",
        ],
    )
    parser.add_argument(
        "-r",
        "--rules",
        metavar="PATH",
        action="append",
        type=Path,
        help="rules file to evaluate (repeatable; order matters)",
    )
    parser.add_argument("--pretty", action="store_true", help="pretty-print the JSON output")
    parser.add_argument(
        "--resolve-host-executables",
        action="store_true",
        help="resolve program paths against basename rules, gated by host_executable()",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND...",
        help="the command tokens (put them after `--` when they start with `-`)",
    )
    parser.set_defaults(handler=run, parser=parser)


def command_tokens(args: argparse.Namespace) -> list[str]:
    """The command after an optional leading ``--``; a usage error (status 2) when empty."""
    tokens: list[str] = list(args.command)
    if tokens and tokens[0] == "--":
        tokens = tokens[1:]
    if not tokens:
        args.parser.error("the following arguments are required: COMMAND")
    for token in tokens:
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            args.parser.error("invalid UTF-8 was detected in one or more arguments")
    return tokens


def run(args: argparse.Namespace) -> int:
    command = command_tokens(args)
    cwd = working_directory()
    # Admin requirements apply on top of --rules too (without any, the output is Codex's).
    try:
        loaded = load_chosen_policy(args.rules) if args.rules else load_layered_policy(cwd)
    except PolicyError as exc:  # in Codex's words, as `codex execpolicy check` says it
        raise ExecgateError(exc.codex_text) from None
    for warning in loaded.warnings:
        print(f"execgate: warning: {warning}", file=sys.stderr)
    if loaded.fail_closed_reason:
        raise ExecgateError(loaded.fail_closed_reason)
    policy = loaded.policy
    evaluation = policy.evaluate(command, resolve_host_executables=args.resolve_host_executables)
    print(evaluation.to_check_json(pretty=args.pretty))
    return 0
