"""``execgate log``: show, verify and replay the decision log."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from execgate.errors import ExecgateError

EXAMPLES = [
    "execgate log --denied --since 1h",
    "execgate log --prompts --session 4626c99c --json",
    "execgate log --follow --grep git",
    "execgate log verify",
    "execgate log replay --rules stricter.rules --since 7d",
]


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="WHEN", help="only since then: 30m, 1h, 2d, or a date")
    parser.add_argument("--denied", action="store_true", help="only denials")
    parser.add_argument("--prompts", action="store_true", help="only prompts a human answered")
    parser.add_argument("--session", metavar="ID", help="only this session (an ID prefix)")
    parser.add_argument("--grep", metavar="REGEX", help="only decisions whose line matches")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "log",
        help="show the decision log (every exec decision of every session)",
        description=(
            "Show the decision log: one line a decision (run, escalate, deny; who answered a "
            "prompt), oldest first. The log is $EXECGATE_HOME/log/decisions.jsonl (else "
            "~/.local/state/execgate/decisions.jsonl), hash-chained and rotated by size."
        ),
        examples=EXAMPLES,
    )
    _add_filters(parser)
    parser.add_argument("--json", action="store_true", help="print the records as JSON lines")
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new decisions as they come"
    )
    parser.set_defaults(handler=run_show)
    actions = parser.add_subparsers(dest="log_command", metavar="ACTION")

    verify = actions.add_parser(
        "verify",
        help="check the hash chain; name the first broken line",
        description="Check that every line follows the line before it (the hash chain), "
        "across rotated files. Exit status 1 names the first broken line.",
        examples=["execgate log verify"],
    )
    verify.set_defaults(handler=run_verify)

    replay = actions.add_parser(
        "replay",
        help="what other rules would have decided about past execs",
        description="Decide every logged exec again under the given rules files (and the "
        "admin's requirements) and print what would change, with counts.",
        examples=["execgate log replay --rules ~/new.rules --since 7d"],
    )
    replay.add_argument(
        "--rules", "-r", action="append", required=True, metavar="FILE", help="rules file"
    )
    replay.add_argument("--since", metavar="WHEN", help="only execs since then (30m, 1h, 2d)")
    replay.set_defaults(handler=run_replay)


def _log_path() -> Any:
    from execgate.paths import decision_log_file

    return decision_log_file()


def _filter(args: argparse.Namespace) -> Any:
    from execgate.decisionlog.query import Filter, parse_since

    try:
        grep = re.compile(args.grep) if args.grep else None
    except re.error as exc:
        raise ExecgateError(
            f"--grep {args.grep}: not a regular expression: {exc}", exit_status=2
        ) from None
    return Filter(
        since=parse_since(args.since) if args.since else None,
        denied=args.denied,
        prompts=args.prompts,
        session=args.session,
        grep=grep,
    )


def _colour() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def run_show(args: argparse.Namespace) -> int:
    from execgate.decisionlog.query import follow, records, render

    path = _log_path()
    keep = _filter(args)
    colour = _colour()

    def show(record: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps(record, separators=(",", ":")))
        else:
            print(render(record, colour=colour))

    shown = 0
    for record in records(path, keep):
        show(record)
        shown += 1
    if not args.follow:
        if shown == 0 and not path.exists():
            print(f"no decisions logged yet ({path})", file=sys.stderr)
        return 0
    sys.stdout.flush()
    for record in follow(path, keep):
        show(record)
        sys.stdout.flush()
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from execgate.decisionlog.chain import verify

    path = _log_path()
    result = verify(path)
    if result.broken:
        print(f"execgate: log verify: BROKEN at {result.broken}")
        return 1
    print(f"{path}: {result.lines} lines in {result.files} file(s), the chain is intact")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from execgate.decisionlog.query import parse_since, record_time, records
    from execgate.decisionlog.replay import replay
    from execgate.policy import load_chosen_policy

    since = parse_since(args.since) if args.since else None
    policy = load_chosen_policy([Path(p) for p in args.rules]).policy
    result = replay(
        records(_log_path(), lambda r: since is None or record_time(r) >= since),
        policy,
    )
    for line in result.lines():
        print(line)
    return 0
