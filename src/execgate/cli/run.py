"""``execgate run``: run a command with every exec it (or anything it starts) makes gated."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from execgate import native, paths
from execgate.cli.options import add_gate_arguments
from execgate.cli.workdir import working_directory
from execgate.config import load_config
from execgate.decisionlog import open_front_log
from execgate.errors import ExecgateError
from execgate.gate import orphans
from execgate.gate.askers import DenyingAsker, TerminalAsker
from execgate.gate.escalation import Asker
from execgate.gate.launcher import LaunchedProcess
from execgate.gate.livepolicy import GatePolicy, PolicySource
from execgate.gate.reload import Loaded, PolicyReloader
from execgate.gate.session import (
    EscalationSession,
    SessionCaller,
    SessionConfig,
    SessionDenied,
    log_escalations,
)
from execgate.gate.skills import skill_scripts
from execgate.policy import LoadedPolicy
from execgate.sandbox import add_sandbox_arguments, probe, sandbox_from_args
from execgate.visible import VisibleFormatter


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a command with every program execution gated by policy",
        description=(
            "Run CMD in this terminal. Every program that CMD, or anything it starts, tries "
            "to execute is decided by policy first; prompts appear on the terminal. Changed "
            "rules files are reloaded during the run."
        ),
        examples=[
            "execgate run -- bash",
            "execgate run --sandbox workspace-write -- make test",
            "execgate run --on-prompt deny --audit audit.jsonl -- ./ci.sh",
        ],
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
    working_directory()  # a deleted one: say so before anything starts
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
    cwd = str(working_directory())
    loop = asyncio.get_running_loop()
    # Checks the session's opening repeats (answered at once then, each remembered in this
    # process) run meanwhile, while the policy loads: the native files' digests (hashing
    # releases the GIL) and the kernel's sandbox support (a process of its own). A failure
    # is raised again where the opening asks.
    checks: list[Callable[[], object]] = [native.verify_installation]
    if (args.sandbox_mode or config.sandbox.mode or "off") != "off":
        checks.append(probe)
    meanwhile = [loop.run_in_executor(None, check) for check in checks]
    for future in meanwhile:
        future.add_done_callback(_retrieve)
    source = PolicySource(tuple(args.rules or ()), Path(cwd), config)
    load = source.load()
    for warning in load.warnings:
        print(f"execgate: warning: {warning}", file=sys.stderr)
    gate = GatePolicy(
        load,
        search_path=os.environ.get("PATH", os.defpath),
        ask_always=args.audit is not None,
        on_prompt_deny=args.on_prompt == "deny",
        skills=skill_scripts(config),
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
    network = None
    if sandbox is not None and sandbox.network_proxy:  # else no proxy: nothing to decide
        from execgate.gate.network import NetworkSettings, default_for

        network = NetworkSettings(
            default=default_for(
                config.network.default, can_ask=args.on_prompt != "deny" and _has_terminal()
            ),
            hosts_file=config.network.hosts_file,
            approvals=lambda: gate.approvals,
        )
    # Like a shell running a foreground job: the terminal's Ctrl-C and Ctrl-\ are for the
    # command; we outlive them to clean up. SIGTERM/SIGHUP end the whole session.
    for signum in (signal.SIGINT, signal.SIGQUIT):
        loop.add_signal_handler(signum, lambda: None)
    # SIGTERM/SIGHUP end the wait for the command (then the session is closed).
    ending = _Ending()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, ending.signal)
    reloader = _reloader(source, gate, load)
    decisions = open_front_log("run", config, audit=args.audit)
    moved = paths.log_dir_moved()
    if moved:
        print(f"execgate: warning: {moved}", file=sys.stderr)
    log_escalations()
    await asyncio.wait(meanwhile)
    session = await EscalationSession.open(
        SessionConfig(
            live=gate.live,
            escalation=gate.escalation,
            sandbox=sandbox,
            gate_escalated=config.gate_escalated,
            clean_escalated_env=config.clean_escalated_env,
            approval_timeout=config.approval_timeout,
            network=network,
        ),
        SessionCaller(gate.approvals.recording(asker), decisions=decisions),
    )
    try:
        async with reloader.watching():
            return await _wait(session, command, cwd, ending)
    finally:
        await session.aclose()
        decisions.close()


def _reloader(
    source: PolicySource, gate: GatePolicy, first: LoadedPolicy
) -> PolicyReloader[LoadedPolicy]:
    """Changed rules files are reloaded during the run (as ``execgate mcp`` does); an edit
    that does not load keeps the previous rules, and the terminal is told why."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter("execgate: %(message)s"))
    logger = logging.getLogger("execgate.reload")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False

    def load() -> Loaded[LoadedPolicy]:
        fresh = source.load()
        for warning in fresh.warnings:
            logger.warning("warning: %s", warning)
        return Loaded(fresh, fresh.watch_paths)

    return PolicyReloader(load, lambda loaded: gate.apply(loaded.value), first.watch_paths)


class _Ending:
    """SIGTERM/SIGHUP end the wait for the command: at once while it waits, and before it
    begins when the signal came first."""

    def __init__(self) -> None:
        self.signalled = False
        self._waiting: asyncio.Timeout | None = None

    def signal(self) -> None:
        self.signalled = True
        if self._waiting is not None and self._waiting.when() is None:
            self._waiting.reschedule(asyncio.get_running_loop().time())

    async def wait(self, process: LaunchedProcess) -> int:
        """The process's wait status, or SIGTERM's once a signal ended the wait."""
        if self.signalled:
            return signal.SIGTERM
        waiting = self._waiting = asyncio.timeout(None)
        try:
            async with waiting:
                return await process.wait()
        except TimeoutError:
            if not waiting.expired():
                raise
            return signal.SIGTERM  # a wait status: killed by SIGTERM
        finally:
            self._waiting = None  # a signal during the teardown has nothing left to end


async def _wait(session: EscalationSession, command: list[str], cwd: str, ending: _Ending) -> int:
    """Start ``command`` in ``session``; its wait status (or SIGTERM's, when SIGTERM/SIGHUP
    ended the wait)."""
    try:
        process = await session.start(command, cwd=cwd, env=os.environ, stdio={0: 0, 1: 1, 2: 2})
    except SessionDenied as denied:
        print(denied.message, file=sys.stderr)
        return 126 << 8
    return await ending.wait(process)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _has_terminal() -> bool:
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        return False
    return True
