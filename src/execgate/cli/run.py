"""``execgate run``: run a command with every exec it (or anything it starts) makes gated."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from execgate.cli.options import add_gate_arguments
from execgate.config import load_config
from execgate.decisionlog import open_front_log
from execgate.errors import ExecgateError
from execgate.gate import orphans
from execgate.gate.askers import DenyingAsker, TerminalAsker
from execgate.gate.escalation import Asker
from execgate.gate.livepolicy import GatePolicy, PolicySource
from execgate.gate.network import NetworkSettings, default_for
from execgate.gate.session import EscalationSession, SessionDenied, log_escalations
from execgate.sandbox import add_sandbox_arguments, sandbox_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a command with every program execution gated by policy",
        description=(
            "Run CMD in this terminal. Every program that CMD, or anything it starts, tries "
            "to execute is decided by policy first; prompts appear on the terminal."
        ),
    )
    add_gate_arguments(parser, asks="on the terminal")
    add_sandbox_arguments(parser, default_mode="off")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD...")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ExecgateError("no command given: execgate run [OPTIONS] -- CMD...", exit_status=2)
    orphans.adopt_orphans()  # what a killed launcher leaves behind is ours to kill
    status = asyncio.run(_run(args, command))
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # died of a signal: die of the same one, so our caller sees the truth
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


async def _run(args: argparse.Namespace, command: list[str]) -> int:
    config = load_config()
    cwd = os.getcwd()
    load = PolicySource(tuple(args.rules or ()), Path(cwd), config).load()
    for warning in load.warnings:
        print(f"execgate: warning: {warning}", file=sys.stderr)
    gate = GatePolicy(
        load,
        search_path=os.environ.get("PATH", os.defpath),
        ask_always=args.audit is not None,
        on_prompt_deny=args.on_prompt == "deny",
    )
    asker: Asker
    if args.on_prompt == "deny":
        asker = DenyingAsker("prompts are set to deny (--on-prompt deny)")
    else:
        asker = TerminalAsker()
    sandbox = sandbox_from_args(
        args,
        config.sandbox,
        cwd=Path(cwd),
        default_mode="off",
        network_rules=bool(load.policy.network_rules),
    )
    network = NetworkSettings(
        default=default_for(
            config.network.default, can_ask=args.on_prompt != "deny" and _has_terminal()
        ),
        hosts_file=config.network.hosts_file,
        approvals=lambda: gate.approvals,
    )
    loop = asyncio.get_running_loop()
    # Like a shell running a foreground job: the terminal's Ctrl-C and Ctrl-\ are for the
    # command; we outlive them to clean up. SIGTERM/SIGHUP end the whole session.
    for signum in (signal.SIGINT, signal.SIGQUIT):
        loop.add_signal_handler(signum, lambda: None)
    ended = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, ended.set)
    decisions = open_front_log("run", config, audit=args.audit)
    log_escalations()
    session = await EscalationSession.open(
        live=gate.live,
        escalation=gate.escalation,
        asker=gate.approvals.recording(asker),
        sandbox=sandbox,
        gate_escalated=config.gate_escalated,
        clean_escalated_env=config.clean_escalated_env,
        approval_timeout=config.approval_timeout,
        decisions=decisions,
        network=network,
    )
    try:
        try:
            process = await session.start(
                command, cwd=cwd, env=os.environ, stdio={0: 0, 1: 1, 2: 2}
            )
        except SessionDenied as denied:
            print(denied.message, file=sys.stderr)
            return 126 << 8
        waiting = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(ended.wait())
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if waiting.done():
            stopping.cancel()
            return waiting.result()
        waiting.cancel()
        return signal.SIGTERM  # a wait status: killed by SIGTERM
    finally:
        await session.aclose()
        decisions.close()


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        return False
    return True
