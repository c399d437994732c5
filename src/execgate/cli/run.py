"""``execgate run``: run a command with every exec it (or anything it starts) makes gated."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execgate import native, paths
from execgate.cli.options import add_gate_arguments
from execgate.cli.workdir import working_directory
from execgate.config import Config, load_config
from execgate.decisionlog import open_front_log
from execgate.errors import ExecgateError
from execgate.gate import orphans, runplan
from execgate.gate.askers import DenyingAsker, TerminalAsker
from execgate.gate.escalation import Asker
from execgate.gate.launcher import LaunchedProcess
from execgate.gate.livepolicy import GatePolicy, LivePolicy, PolicySource
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

if TYPE_CHECKING:
    from execgate.adopt import FrontStart


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
    return _exit_like(asyncio.run(_run(args, command)))


def serve_adopted(start: FrontStart) -> int:
    """The server of a native start (execgate/adopt.py): ``execgate run`` from the point
    where the native front started the command (docs/protocol.md §8)."""
    from execgate.cli import build_parser

    args = build_parser("run").parse_args(["run", *start.plan.options, "--", *start.command])
    # The command's Ctrl-C is not ours; the front stops us with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _exit_like(asyncio.run(_run(args, start.command, start)))


def _exit_status(status: int) -> int:
    """The exit status a shell reports for the command's wait status (128 + N: signal N)."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _exit_like(status: int) -> int:
    """``execgate run``'s exit for the command's wait status."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # died of a signal: die of the same one, so our caller sees the truth
        sys.stdout.flush()
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # (those cannot be handled)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return _exit_status(status)


async def _run(
    args: argparse.Namespace, command: list[str], adopted: FrontStart | None = None
) -> int:
    config = load_config()
    cwd = str(working_directory()) if adopted is None else adopted.cwd
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
    decisions = open_front_log(
        "run", config, audit=args.audit, session=adopted.session_id if adopted else None
    )
    moved = paths.log_dir_moved()
    if moved:
        print(f"execgate: warning: {moved}", file=sys.stderr)
    log_escalations()
    await asyncio.wait(meanwhile)
    session_config = SessionConfig(
        live=gate.live,
        escalation=gate.escalation,
        sandbox=sandbox,
        gate_escalated=config.gate_escalated,
        clean_escalated_env=config.clean_escalated_env,
        approval_timeout=config.approval_timeout,
        network=network,
    )
    caller = SessionCaller(gate.approvals.recording(asker), decisions=decisions)
    if adopted is not None:
        log = _planned_log(config)
        return await _serve_adopted(adopted, session_config, caller, gate, reloader, ending, log)
    session = await EscalationSession.open(session_config, caller)
    try:
        async with reloader.watching():
            options = _plan_options(args)

            def plan() -> None:  # once the command runs: not on its way
                if options is not None:
                    _write_plan(options, config, load, session, cwd, lambda: fresh(source))

            def fresh(source: PolicySource) -> bytes:
                """The snapshot of the policy as the files are now."""
                load = source.load()
                again = LivePolicy(
                    load.policy,
                    search_path=os.environ.get("PATH", os.defpath),
                    fail_closed_reason=load.fail_closed_reason,
                    skills=skill_scripts(config),
                )
                # closed now: its folder watch would stay open until a garbage collection
                with contextlib.closing(again):
                    return again.snapshot

            return await _wait(session, command, cwd, ending, plan)
    finally:
        await session.aclose()
        decisions.close()


async def _serve_adopted(
    start: FrontStart,
    config: SessionConfig,
    caller: SessionCaller,
    gate: GatePolicy,
    reloader: PolicyReloader[LoadedPolicy],
    ending: _Ending,
    log: tuple[str, int, int],
) -> int:
    """Serve the session the native front opened, once what we computed equals its plan."""
    from execgate.gate.launcher import Launcher
    from execgate.gate.session import AdoptedParts

    pid = _launcher_pid()
    launched = _launcher_options(pid, start.plan.launcher)
    if config.sandbox is not None and config.sandbox.confines:
        # the protected names that existed when the front started, as it told the launcher
        known = _known_carveouts(launched)
        config = dataclasses.replace(
            config, sandbox=dataclasses.replace(config.sandbox, known_carveouts=known)
        )
    launcher, main = Launcher.adopt(
        pid, socket.socket(fileno=start.control_fd), config.sandbox, main_id=1
    )
    parts = AdoptedParts(
        dir=start.session_dir,
        token=start.token,
        escalated_token=start.escalated_token,
        listener=socket.socket(fileno=start.listen_fd),
        snapshot_fd=start.snapshot_fd if start.snapshot_fd >= 0 else None,
        launcher=launcher,
        main=main,
        standins=start.plan.standins,
    )
    session = EscalationSession.adopt(config, caller, parts)
    status: int | None = None
    try:
        stale = _differs_from_plan(start, session, gate, log, launched)
        if stale is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the front waits for our status
            with contextlib.suppress(OSError):
                runplan.plan_path(start.plan.front, start.cwd, start.plan.options).unlink()
            print(
                f"execgate: error: the session was ended: its start-up plan was stale ({stale})",
                file=sys.stderr,
            )
            status = STALE_PLAN << 8
            return status
        async with reloader.watching():
            status = await ending.wait(await main)
            return status
    finally:
        loop = asyncio.get_running_loop()
        outlive_signals(loop)
        try:
            await session.aclose()
            if caller.decisions is not None:
                caller.decisions.close()
            if status is not None:
                # The session is closed and its records are written: the front need not
                # wait for the event loop's own teardown (a thread to join its executor).
                start.say_done(_exit_status(status))
        finally:
            for signum in ENDING_SIGNALS:  # (else the loop's close makes them the defaults)
                loop.remove_signal_handler(signum)
                signal.signal(signum, signal.SIG_IGN)


#: What the server of a native start outlives once its command is done.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)


def outlive_signals(loop: asyncio.AbstractEventLoop) -> None:
    """From here on the server of a native start ends by itself, once its records are
    written: the front's SIGTERM (sent once the command is done), a SIGHUP or a Ctrl-C no
    longer end it. The handlers are replaced, not removed: a removed one is the signal's
    default action (death, the last records lost) until the next call replaces it."""
    for signum in ENDING_SIGNALS:
        loop.add_signal_handler(signum, lambda: None)


#: The server's exit status when it ended a native start's session for a stale plan (the
#: front then exits 1; native/front.c).
STALE_PLAN = 3


def _launcher_pid() -> int | None:
    """The native front's launcher: the front's other child (our parent's); None once it has
    exited (the front reaps it at once: the command ended before this server looked)."""
    ppid = os.getppid()
    for task in os.listdir(f"/proc/{ppid}/task"):
        with open(f"/proc/{ppid}/task/{task}/children", encoding="ascii") as f:
            for pid in f.read().split():
                if int(pid) != os.getpid():
                    return int(pid)
    return None


class LauncherGone:
    """The front's launcher exited before the server read its command line (the command
    ended, or killed it): there is nothing left to compare, and the session is over."""


def _launcher_options(pid: int | None, launcher: str) -> list[str] | LauncherGone | None:
    """The sandbox options the front's launcher runs with (its command line after
    ``--control N --claim-fd N --status-fd N``), read once it runs ``launcher``; None when
    its command line is not the front's. What is read by pid is read while a pidfd says the
    process is still the launcher (the front reaps it once it exits: the pid is reused)."""
    if pid is None:
        return LauncherGone()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return LauncherGone()
    except OSError:  # (no pidfds, Linux < 5.3: then by pid alone)
        pidfd = -1
    try:
        deadline = time.monotonic() + 30  # it execs at once: a bound for a loaded machine
        while True:
            try:
                running = os.readlink(f"/proc/{pid}/exe")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = [os.fsdecode(w) for w in f.read().split(b"\0")[:-1]]
                read_alive = True
            except OSError:
                read_alive = False
            if pidfd >= 0 and select.select([pidfd], [], [], 0)[0]:
                return LauncherGone()  # (what was read may not be the launcher's)
            if not read_alive:
                return None
            if running == launcher or time.monotonic() > deadline:
                break
            time.sleep(0.002)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    front = ["--control", "--claim-fd", "--status-fd"]
    if running != launcher or words[1:7:2] != front:
        return None
    return words[7:]


def _known_carveouts(options: list[str] | LauncherGone | None) -> tuple[tuple[int, int], ...]:
    if not isinstance(options, list) or "--known-carveouts" not in options[:-1]:
        return ()  # (then the launcher's options differ from ours: the session ends)
    listed = options[options.index("--known-carveouts") + 1]
    found = []
    for item in filter(None, listed.split(",")):
        dev, _, ino = item.partition(":")
        if not (dev.isdigit() and ino.isdigit()):
            return ()
        found.append((int(dev), int(ino)))
    return tuple(found)


def _differs_from_plan(
    start: FrontStart,
    session: EscalationSession,
    gate: GatePolicy,
    log: tuple[str, int, int],
    launched: list[str] | LauncherGone | None,
) -> str | None:
    """What differs between the plan the front followed and what this server computed
    (None: nothing): the front it was for (our parent), the snapshot, the gate's native files,
    the sandbox the launcher enforces (its command line), the stand-ins, the decision log, the
    first program's decision."""
    from execgate.gate.escalation import Verdict
    from execgate.gate.session import describe_exec, resolve_command

    plan = start.plan
    try:
        front = os.readlink(f"/proc/{os.getppid()}/exe")
    except OSError:
        front = ""
    if front != plan.front:
        return "the plan is another front's"
    if gate.live.snapshot != plan.snapshot or (
        session.sealed_snapshot is not None and session.sealed_snapshot.contents() != plan.snapshot
    ):
        return "the policy snapshot differs"
    if (os.fspath(session.interposer), os.fspath(session.wrapper)) != (
        plan.interposer,
        plan.wrapper,
    ):
        return "the native files differ"
    if gate.live.fail_closed_reason:
        return "the policy fails closed"
    if session.sandbox_text != plan.sandbox:
        return "the sandbox differs"
    if log != (plan.log, plan.log_max_bytes, plan.log_keep):
        return "the decision log differs"  # (the front wrote the first record there)
    try:
        spec = session.confinement()
    except ExecgateError as exc:  # (a writable root in a state folder, …: refused now)
        return str(exc)
    session.launcher.sandbox = spec
    launch = spec.launcher_args() if spec else []
    carveouts = launch[launch.index("--known-carveouts") + 1] if spec and spec.confines else ""
    if launch != runplan.fill_in(plan, session.dir, carveouts) or not (
        isinstance(launched, LauncherGone) or launch == launched
    ):
        return "the launcher's options differ"
    if spec is not None and spec.confines:
        from execgate.sandbox import require_support

        try:
            require_support(spec)
        except ExecgateError as exc:
            return str(exc)
        if spec.strict_exec or session.proxied:
            return "the sandbox is one a plan does not cover"
    covered = session.standins.programs if session.standins else []
    if covered != (gate.live.rule_named if session.confined else []):
        return "the stand-ins differ"
    path = os.environ.get("PATH", os.defpath)
    program = resolve_command(start.command[0], cwd=start.cwd, path=path)
    if program != start.program:
        return f"the command resolves to {program}"
    exec_ = describe_exec(
        program, start.command, cwd=start.cwd, via="session", contents=gate.live.current_contents()
    )
    action = gate.escalation.decide(exec_, confined=False)
    judged = action.judgement is not None and action.judgement.decision is not None
    if action.verdict != Verdict.RUN or judged or action.reason or action.granted:
        return f"the first program's decision is {action.verdict.value}"
    if exec_.realpath != start.realpath:
        return "the first program is another file"
    return None


def _planned_log(config: Config) -> tuple[str, int, int]:
    """The decision log as a plan names it: its file (``""``: off), rotation size and how
    many rotated files are kept."""
    if not config.log.enabled:
        return "", 0, 0
    return os.fspath(paths.decision_log_file()), config.log.max_bytes, config.log.keep


#: The options a start-up plan covers, each with the values it may have (None: any), in the
#: two-word form only: ``--rules FILE``, ``--sandbox off``, ``--on-prompt ask|deny``.
_PLANNED_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "--rules": None,
    "-r": None,
    "--sandbox": ("off", "workspace-write", "read-only"),
    "--on-prompt": ("ask", "deny"),
}


def _plan_options(args: argparse.Namespace) -> list[str] | None:
    """The option words of this run when a start-up plan can cover them (docs/protocol.md
    §8), or None. The native front finds them as they were typed: before ``--``."""
    words = sys.argv[2:] if sys.argv[1:2] == ["run"] else []
    if not words or words[0] == "--" or not words[0].startswith("-"):
        return []
    if "--" not in words:
        return None
    options = words[: words.index("--")]
    for name, value in zip(options[::2], options[1::2], strict=False):
        allowed = _PLANNED_OPTIONS.get(name, ())
        if allowed == () or (allowed is not None and value not in allowed):
            return None
    return options if len(options) % 2 == 0 else None


def _write_plan(
    options: list[str],
    config: Config,
    load: LoadedPolicy,
    session: EscalationSession,
    cwd: str,
    fresh_snapshot: Callable[[], bytes],
) -> None:
    """Write the start-up plan of this run for the native front, when one can cover it
    (no proxy, no strict-exec, no OTLP export, requirements from files, a policy that does
    not fail closed); else remove a plan left from before. The plan is for the front that
    handed this run here (``console.declined_by``): without one, none is written.

    The inputs' identities are taken after the policy was read: a file changed in between
    would pair its new identity with the old policy's snapshot. So the policy is read once
    more after the identities were taken, and the plan is written only when that gives the
    snapshot the session has (a change after the identities makes the plan stale)."""
    from execgate import console

    front = console.declined_by
    if front is None:  # started without the native front: no front would follow a plan
        return
    snapshot = session.live.snapshot
    from execgate.decisionlog.otel import settings_from

    target = runplan.plan_path(front, cwd, options)
    local = all(
        source.layer != "requirements" or os.path.isabs(source.path) for source in load.sources
    )
    sandbox = session.sandbox
    confined = sandbox is not None and sandbox.confines
    from execgate.sandbox.guarded import guard_inputs

    if (
        (confined and sandbox is not None and (sandbox.strict_exec or sandbox.network_proxy))
        or session.network_gate is not None
        or load.fail_closed_reason
        or settings_from(config.otel, os.environ) is not None
        or not local
        or (session.sealed_snapshot is None) != confined
    ):
        with contextlib.suppress(OSError):
            target.unlink()
        return
    inputs = [
        *load.watch_paths,
        *(source.path for source in load.sources if source.path.is_absolute()),
        *(folder.path for folder in load.folders),
        *runplan.ancestors_markers(Path(cwd)),
        config.path or paths.config_file(),
        *session.live.planned_inputs(),
        *runplan.package_files(),
        Path(sys.executable),
    ]
    log = _planned_log(config)
    try:
        text = runplan.render(
            front=front,
            cwd=cwd,
            options=options,
            inputs=inputs,
            snapshot=snapshot,
            sessions=session.dir.parent,
            log=log if log[0] else None,
            sandbox=session.sandbox_text,
            launch_options=session.launcher.sandbox.launcher_args()
            if session.launcher.sandbox
            else [],
            session_dir=session.dir,
            standins=session.standins.programs if session.standins else (),
            folders=[
                *(guard_inputs(sandbox) if sandbox is not None else []),
                # as configured: a link among them may be retargeted (the spec has their ends)
                *(Path(os.path.expanduser(root)) for root in config.sandbox.writable_roots),
            ],
        )
        if fresh_snapshot() != snapshot:
            raise runplan.Unplannable("the policy changed while the plan was made")
        runplan.write(target, text)
    except (runplan.Unplannable, OSError, ExecgateError):
        with contextlib.suppress(OSError):
            target.unlink()


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


async def _wait(
    session: EscalationSession,
    command: list[str],
    cwd: str,
    ending: _Ending,
    started: Callable[[], None],
) -> int:
    """Start ``command`` in ``session``, call ``started`` (also when it was denied); its wait
    status (or SIGTERM's, when SIGTERM/SIGHUP ended the wait)."""
    try:
        process = await session.start(command, cwd=cwd, env=os.environ, stdio={0: 0, 1: 1, 2: 2})
    except SessionDenied as denied:
        print(denied.message, file=sys.stderr)
        started()
        return 126 << 8
    started()
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
