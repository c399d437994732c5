"""``execgate approvals``: list and answer the approvals running ``execgate mcp`` servers wait for.

For MCP clients that cannot ask the human themselves (no elicitation), and for answering from
another terminal in general. Servers are found through ``$EXECGATE_HOME/run/`` (see
:mod:`execgate.mcp_front.control`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from execgate.errors import ExecgateError
from execgate.visible import command_line, quote_word, visible


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "approvals",
        help="list and answer the approvals running `execgate mcp` servers wait for",
        description=(
            "List the commands running `execgate mcp` servers are waiting to have approved, "
            "and allow or deny them by ID."
        ),
        examples=["execgate approvals", "execgate approvals allow 4242.1 --session"],
    )
    commands = parser.add_subparsers(dest="approvals_command", metavar="ACTION")
    parser.set_defaults(handler=run_list, json=False)  # `execgate approvals` alone: list

    listing = commands.add_parser(
        "list",
        help="list pending approvals (the default)",
        description="List the approvals every running `execgate mcp` server of yours waits "
        "for: the command as judged, its cwd, the rule that asks, and the ID to answer with.",
        examples=["execgate approvals list", "execgate approvals list --json"],
    )
    listing.add_argument("--json", action="store_true", help="print JSON (one object)")
    listing.set_defaults(handler=run_list)

    allow = commands.add_parser(
        "allow",
        help="let a pending command run",
        description="Allow a pending command once, for the rest of its MCP session, or "
        "always (an allow rule appended to your rules file).",
        examples=["execgate approvals allow 4242.1", "execgate approvals allow 1 --always"],
    )
    allow.add_argument(
        "id", metavar="ID", help="the approval's ID (from `execgate approvals list`)"
    )
    scope = allow.add_mutually_exclusive_group()
    scope.add_argument(
        "--session",
        action="store_true",
        help="also allow this command prefix for the rest of that MCP session",
    )
    scope.add_argument(
        "--always",
        action="store_true",
        help="also allow it from now on (appends an allow rule to your rules file)",
    )
    allow.add_argument("--reason", metavar="TEXT", help="why (recorded in the server's log)")
    allow.set_defaults(handler=run_allow)

    deny = commands.add_parser(
        "deny",
        help="refuse a pending command",
        description="Refuse a pending command; the reason is shown to the agent.",
        examples=['execgate approvals deny 4242.1 --reason "not on main"'],
    )
    deny.add_argument("id", metavar="ID", help="the approval's ID (from `execgate approvals list`)")
    deny.add_argument("--reason", metavar="TEXT", help="why (shown to the agent)")
    deny.set_defaults(handler=run_deny)

    grants = commands.add_parser(
        "grants",
        help='list what "for this session/run" and "always" answers granted',
        description=(
            'List the grants people gave (from the decision log): "always" answers (the allow '
            'rule line and its file, while it is there) and "for this session/run" answers '
            "(the session), with when and who answered."
        ),
        examples=["execgate approvals grants --json"],
    )
    grants.add_argument("--json", action="store_true", help="print JSON (one object)")
    grants.set_defaults(handler=run_grants)

    revoke = commands.add_parser(
        "revoke",
        help="withdraw a grant (an always rule line, or a running MCP session's grant)",
        description=(
            "Withdraw a grant by its ID (from `execgate approvals grants`): a lasting grant by "
            "removing its rule line from the file (the rest of the file stays byte for byte), a "
            "session grant by telling the running `execgate mcp` server to ask again."
        ),
        examples=["execgate approvals revoke 3f2a9c0b1d"],
    )
    revoke.add_argument("id", metavar="ID", help="the grant's ID")
    revoke.set_defaults(handler=run_revoke)


def _servers() -> list[Any]:
    from execgate.mcp_front.control import running_servers

    return running_servers()


def _listings() -> list[tuple[Any, dict[str, Any]]]:
    from execgate.mcp_front.control import request

    found = []
    for server in _servers():
        try:
            reply = request(server, {"op": "list"})
        except ExecgateError as exc:
            print(f"execgate: warning: {exc}", file=sys.stderr)
            continue
        if reply.get("ok"):
            found.append((server, reply))
    return found


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_list(args: argparse.Namespace) -> int:
    from execgate.paths import control_dir

    listings = _listings()
    if args.json:
        servers = [
            {"pid": server.pid, "socket": str(server.socket), **reply.get("server", {}),
             "pending": reply.get("pending", [])}
            for server, reply in listings
        ]  # fmt: skip
        # ASCII only: a command's C1 controls or bidi overrides stay \u escapes on a terminal
        print(json.dumps({"servers": servers}, ensure_ascii=True, indent=2))
        return 0
    if not listings:
        print(f"no execgate mcp server is running (looked in {control_dir()})")
        return 0
    pending = [(server, q) for server, reply in listings for q in reply.get("pending", [])]
    if not pending:
        pids = ", ".join(str(server.pid) for server, _ in listings)
        print(f"no pending approvals (servers running: {pids})")
        return 0
    now = time.time()
    for server, q in pending:
        for line in _describe(q, now):
            print(line)
        options = "once, session" + (", always" if q.get("offer_always") else "") + ", deny"
        print(f"    server:  pid {server.pid}; answers: {options}")
    return 0


def _describe(q: dict[str, Any], now: float) -> list[str]:
    """One pending approval as lines a human can trust: the command as judged (the program
    that was identified, then the arguments), every text rendered visible."""
    argv = [str(word) for word in q.get("argv", [])]
    program = str(q.get("program", ""))
    question_id = visible(str(q.get("id", "")), 100)
    net = q.get("network")
    if isinstance(net, dict):  # a connection through the session's proxy
        addresses = ", ".join(visible(str(a), 100) for a in net.get("addresses", []))
        lines = [
            f"{question_id}  waiting {_age(now - q.get('asked_at', now))}  network access to "
            f"{visible(str(net.get('host')), 300)} port {net.get('port')} "
            f"({visible(str(net.get('protocol')), 20)})",
            f"    address: {addresses or 'unknown'}",
            f"    by:      {command_line(argv, 2000)} (pid {q.get('pid')})",
        ]
        lines += [f"    rule:    {visible(str(r), 600)}" for r in net.get("rules", [])]
    else:
        lines = _describe_exec(q, now, question_id, argv, program)
    call = q.get("tool_call", {})
    lines.append(
        f"    agent's command: {visible(str(call.get('command', '')), 400)}"
        f"  (in {quote_word(str(call.get('workdir', '')))})"
    )
    lines.append(
        f"    asked via {visible(str(q.get('asked_via')))}; "
        f"answer: execgate approvals allow|deny {question_id}"
    )
    return lines


def _describe_exec(
    q: dict[str, Any], now: float, question_id: str, argv: list[str], program: str
) -> list[str]:
    lines = [
        f"{question_id}  waiting {_age(now - q.get('asked_at', now))}  "
        f"{command_line([program, *argv[1:]], 2000)}",
        f"    argv:    {command_line(argv, 2000)}",
        f"    cwd:     {quote_word(str(q.get('cwd', '')))}",
    ]
    for rule in q.get("rules", []):
        location, prefix = visible(str(rule["location"])), command_line(rule["prefix"])
        lines.append(f"    rule:    {location} (prefix `{prefix}`)")
    if q.get("justification"):
        lines.append(f"    why:     {visible(str(q['justification']), 1000)}")
    return lines


def _find(question_id: str) -> Any:
    """The server holding approval ``question_id`` (``PID.N``, or ``N`` if only one matches)."""
    servers = _servers()
    if not servers:
        raise ExecgateError("no execgate mcp server is running")
    pid_part, dot, _ = question_id.partition(".")
    if dot and pid_part.isdigit():
        for server in servers:
            if server.pid == int(pid_part):
                return server
        raise ExecgateError(
            f"no running execgate mcp server has approval {question_id} "
            "(execgate approvals list shows the pending ones)"
        )
    matches = [
        (server, q["id"])
        for server, reply in _listings()
        for q in reply.get("pending", [])
        if q["id"].rpartition(".")[2] == question_id
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ExecgateError(f"no pending approval {question_id} (execgate approvals list)")
    raise ExecgateError(
        f"approval {question_id} is ambiguous: "
        + ", ".join(full for _, full in matches)
        + "; give the full ID"
    )


def _answer(question_id: str, answer: str, reason: str | None) -> int:
    from execgate.mcp_front.control import request

    found = _find(question_id)
    server, full_id = found if isinstance(found, tuple) else (found, question_id)
    reply = request(server, {"op": "answer", "id": full_id, "answer": answer, "reason": reason})
    if not reply.get("ok"):
        raise ExecgateError(str(reply.get("error", "the server refused the answer")))
    verb = "denied" if answer == "deny" else f"allowed ({answer})"
    print(f"{visible(full_id, 100)}: {verb}: {visible(str(reply.get('command', '')), 2000)}")
    return 0


def run_allow(args: argparse.Namespace) -> int:
    answer = "always" if args.always else "session" if args.session else "once"
    return _answer(args.id, answer, args.reason)


def run_deny(args: argparse.Namespace) -> int:
    return _answer(args.id, "deny", args.reason)


# -- grants ------------------------------------------------------------------------------------


def _grants() -> list[Any]:
    from execgate.decisionlog.grants import grants
    from execgate.decisionlog.query import records
    from execgate.paths import decision_log_file

    return grants(records(decision_log_file()))


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def run_grants(args: argparse.Namespace) -> int:
    from execgate.decisionlog.grants import rule_line_number

    found = []
    for grant in _grants():
        line = rule_line_number(grant) if grant.scope == "always" else None
        if grant.scope == "always" and line is None:
            continue  # the rule line is gone: nothing is granted any more
        found.append((grant, line))
    if args.json:
        out = [{**g.as_json(), "rule_line_number": line} for g, line in found]
        print(json.dumps({"grants": out}, ensure_ascii=True, indent=2))
        return 0
    if not found:
        print("no grants (answers of always or for this session/run) in the decision log")
        return 0
    for grant, line in found:
        prefix = command_line(grant.prefix, 400)
        # The log is the user's file, writable by a gated process when the sandbox is off.
        who = f"{_when(grant.time)} by {visible(grant.answered_by, 40)}"
        call = f" call {visible(str(grant.call), 20)}" if grant.call is not None else ""
        session = f"session {visible(grant.front, 20)}:{visible(grant.session[:8])}{call}"
        if grant.scope == "always":
            where = f"{quote_word(str(grant.rule_file))}:{line}"
            print(f"{grant.id}  always   `{prefix}`  {where}  {who} ({session})")
            print(f"    rule: {visible(str(grant.rule_line), 1000)}")
        else:
            print(f"{grant.id}  session  `{prefix}`  {session}  {who}")
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from execgate.decisionlog import open_decision_log
    from execgate.paths import decision_log_file
    from execgate.policy import PolicyError, remove_allow_rule

    matches = [g for g in _grants() if g.id.startswith(args.id)] if args.id else []
    if len(matches) != 1:
        why = "no grant" if not matches else "more than one grant"
        raise ExecgateError(f"{why} with ID {args.id} (execgate approvals grants lists them)")
    [grant] = matches
    if grant.scope == "always":
        try:
            removed = remove_allow_rule(Path(str(grant.rule_file)), grant.prefix)
        except PolicyError as exc:
            raise ExecgateError(str(exc)) from None
        if not removed:
            raise ExecgateError(f"{grant.rule_file} no longer has the rule line of {grant.id}")
        done = f"removed {grant.rule_line} from {grant.rule_file}"
    else:
        done = _revoke_in_session(grant)
    decisions = open_decision_log("approvals", path=decision_log_file())
    decisions.record(
        {"kind": "revoke", "grant": grant.id, "scope": grant.scope,
         "revoked_session": grant.session, "prefix": list(grant.prefix),
         "source": "approvals"}
    )  # fmt: skip
    decisions.close()
    print(f"{grant.id}: revoked: {visible(done, 2000)}")
    return 0


def _revoke_in_session(grant: Any) -> str:
    from execgate.mcp_front.control import request

    if grant.front != "mcp":
        raise ExecgateError(
            f"grant {grant.id} belongs to an `execgate run` session: it ends with that run, "
            "which takes no requests from outside"
        )
    for server in _servers():
        if server.info.get("session") == grant.session:
            reply = request(server, {"op": "revoke", "prefix": list(grant.prefix)})
            if not reply.get("ok"):
                raise ExecgateError(str(reply.get("error", "the server refused")))
            return f"`{command_line(grant.prefix)}` asks again in server pid {server.pid}"
    raise ExecgateError(f"the session of grant {grant.id} has ended, and its grants with it")
