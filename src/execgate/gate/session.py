"""One gated run: the socket, token, environment, launcher and every process it started.

:class:`EscalationSession` is what a front end (``execgate run``, one MCP ``shell`` call) opens
around the command it gates. Data flows one way: the :class:`GateServer` reads a request, the
session judges it with its :class:`PolicyEscalation` (asking a human through its
:class:`Asker` when policy says ``prompt``), and escalations are carried out by the session's
launcher: for an ``escalate`` decision the session authorizes a ticket at the launcher, and the
client claims it there directly (docs/protocol.md §4, §7). Closing the session denies pending
questions, kills every process it started — sandboxed, escalated, orphaned — and removes its
files.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from execgate import native, paths
from execgate.decisionlog.argv import bounded_argv
from execgate.decisionlog.recorder import DecisionLog, FlushSoon, permission_entry
from execgate.errors import ExecgateError
from execgate.files import is_own_private_dir, make_private_dir, open_private, write_atomically
from execgate.gate import protocol
from execgate.gate.cleanenv import CleanedVariables, cleaned_variables
from execgate.gate.content import NO_CONTENTS, ContentIndex
from execgate.gate.escalation import (
    Action,
    Approval,
    ApprovalRequest,
    Asker,
    PolicyEscalation,
    Verdict,
    no_one_to_ask,
)
from execgate.gate.gitrepo import sandbox_writable_repository
from execgate.gate.held import HeldShell
from execgate.gate.held import placeholder_argv as held_placeholder_argv
from execgate.gate.held import placeholder_env as held_placeholder_env
from execgate.gate.identity import (
    ExecFile,
    FileId,
    IdentityError,
    inspect_descriptors,
    open_path,
)
from execgate.gate.launcher import (
    LaunchedProcess,
    Launcher,
    LauncherError,
    Tickets,
    authorization,
)
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.program import GatedExec, paths_that_decide, runs_file, vouched
from execgate.gate.protocol import Authorization, EnvRules, ExecRequest, ProtocolError, Stood
from execgate.gate.server import GateServer, Peer, Reply
from execgate.gate.snapshot import SealedSnapshot, with_ask_folders
from execgate.gate.standing import STANDING_VIA, Granted, Standing
from execgate.gate.standins import StandIns
from execgate.handoff import give_way
from execgate.netproxy.variables import PROXY_VARIABLE_NAMES, proxy_variables
from execgate.policy import allow_rule_line
from execgate.sandbox import SandboxSpec, existing_carveouts
from execgate.sandbox.spec import PROXY_PORT
from execgate.visible import VisibleFormatter, quote_word, visible

if TYPE_CHECKING:  # imported where used: `execgate run` without a proxy never needs them
    import anyio
    import anyio.abc

    from execgate.gate.network import NetworkGate, NetworkSettings
    from execgate.netproxy.server import ProxyThread

log = logging.getLogger("execgate.session")
# Every escalation (a program let out of the sandbox), for the record: front ends send it to
# $EXECGATE_HOME/log/escalations.log (see log_escalations()).
escalations = logging.getLogger("execgate.escalations")

GATE_VARIABLES = (
    "EXECGATE_SOCKET",
    "EXECGATE_TOKEN",
    "EXECGATE_WRAPPER",
    "EXEC_WRAPPER",
    "BASH_EXEC_WRAPPER",
    "EXECGATE_SNAPSHOT",
)


# Stands for the program of a request whose descriptors were refused (for its denial line).
_UNKNOWN_FILE = ExecFile(realpath="", dev=0, ino=0, shebang=None)
# Authorizations kept per session, one per escalated command shape (see _authorization).
_AUTHORIZATIONS_KEPT = 256
_ESCALATE_PAYLOAD = protocol.TAG + b"\0escalate\0"  # how an `escalate` answer's payload starts


class SessionDenied(ExecgateError):
    """The session's own command was denied (its message is the denial line)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_status=126)


def _log_escalation(exec_: GatedExec, action: Action, sandbox: str, when: float) -> None:
    """One line of the escalations log: an escalation, or a run the server explained
    (``when``: the time of the decision)."""
    if action.verdict == Verdict.ESCALATE:
        message = "escalated %s (program %s, pid %d, cwd %s, sandbox %s%s)"
        args: tuple[object, ...] = (
            exec_.display(),
            exec_.realpath or exec_.path,
            exec_.pid,
            exec_.cwd,
            sandbox,
            ", standing" if exec_.via == STANDING_VIA else "",
        )
    else:
        message, args = "%s: %s", (exec_.display(), action.reason)
    record = escalations.makeRecord(
        escalations.name, logging.INFO, __file__, 0, message, args, None
    )
    record.created, record.msecs = when, int((when - int(when)) * 1000) + 0.0
    escalations.handle(record)


class _Unlogged:
    """Decisions waiting for their line in the escalations log. Building and writing a line
    costs more than judging the exec, so the lines are made in one batch shortly after the
    answers went out (:data:`FLUSH_DELAY`, as the decision log's records), when a session
    closes and at exit: an exec pays a list append, not a turn of the event loop."""

    def __init__(self) -> None:
        self._items: list[tuple[float, GatedExec, Action, str]] = []
        self._soon = FlushSoon(self.flush)
        atexit.register(self.flush)

    def add(self, exec_: GatedExec, action: Action, sandbox: str, when: float | None) -> None:
        self._items.append((time.time() if when is None else when, exec_, action, sandbox))
        self._soon.queued()

    def flush(self) -> None:
        self._soon.cancel()
        items, self._items = self._items, []
        for when, exec_, action, sandbox in items:
            _log_escalation(exec_, action, sandbox, when)
        if items:
            for handler in escalations.handlers:
                handler.flush()


_unlogged = _Unlogged()


def log_escalations(path: Path | None = None) -> Path | None:
    """Append every escalation to ``path`` (default ``$EXECGATE_HOME/log/escalations.log``).
    Returns the file, or None when it cannot be written (the gate works regardless)."""
    path = path or paths.log_dir() / "escalations.log"
    if any(getattr(h, "baseFilename", None) == str(path) for h in escalations.handlers):
        return path
    try:
        make_private_dir(path.parent)
        handler = BatchedLines(path)  # created 0600
    except OSError as exc:
        log.warning("cannot log escalations to %s: %s", path, exc.strerror)
        return None
    handler.setFormatter(_StampedFormatter("%(asctime)s %(message)s"))
    escalations.addHandler(handler)
    escalations.setLevel(logging.INFO)
    return path


class BatchedLines(logging.Handler):
    """Appends log lines to a file in one ``write`` per batch: the lines wait for
    :meth:`flush`, which :class:`_Unlogged` calls after each batch it logs (and logging calls at
    exit); a line per escalated exec would cost each exec a write. Whole lines only, on an
    ``O_APPEND`` descriptor, so several processes can share the file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.baseFilename = str(path)
        self._fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record) + "\n")
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        with self.lock or contextlib.nullcontext():
            lines, self._lines = self._lines, []
            if not lines or self._fd < 0:
                return
            view = memoryview("".join(lines).encode("utf-8", "backslashreplace"))
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:
                log.warning("cannot write %s: %s", self.baseFilename, exc.strerror)

    def close(self) -> None:
        self.flush()
        with self.lock or contextlib.nullcontext():
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        super().close()


class _StampedFormatter(VisibleFormatter):
    """``asctime`` as :class:`logging.Formatter` writes it, the date and time formatted once
    per second (a line per escalated exec)."""

    _second = -1
    _stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"  # (default_msec_format)


def _session_dir_candidates() -> list[Path]:
    # Last, where every sandbox of the user cannot keep them read-only: only when none of the
    # session folders can be used (execgate run inside another execgate's sandbox).
    return [*paths.session_folders(), Path("/dev/shm"), Path("/tmp")]


_swept = False


def make_session_dir(writable_roots: Sequence[Path]) -> Path:
    """A fresh 0700 folder for the socket and snapshot.

    A confined process must not be able to replace the socket or the snapshot, so a folder
    outside every writable root is preferred; failing that, the sandbox makes the session
    folder a read-only carve-out (``SandboxSpec.with_gate_paths``).
    """
    roots = [Path(os.path.realpath(r)) for r in writable_roots]

    def writable(base: Path) -> bool:
        real = Path(os.path.realpath(base))
        return any(real == r or r in real.parents for r in roots)

    candidates = _session_dir_candidates()
    global _swept
    if not _swept:  # folders of killed servers: once per server (an MCP server opens many)
        remove_stale_session_dirs(candidates)
        _swept = True
    ordered = sorted(candidates, key=writable) if roots else candidates
    for base in ordered:  # stable: outside-the-sandbox ones first
        try:
            make_private_dir(base)
            if not is_own_private_dir(base):  # made by another user first: not ours to use
                continue
            path = Path(tempfile.mkdtemp(prefix=f"execgate-{os.getuid()}-", dir=base))
            (path / _OWNER).write_text(_this_server() + "\n")
        except OSError:
            continue
        if len(os.fsencode(path / "claim.sock")) < 100:  # sun_path limit (and gate.sock)
            return path
        shutil.rmtree(path, ignore_errors=True)
    raise ExecgateError(
        "found no folder for the session socket (tried " + ", ".join(map(str, candidates)) + ")"
    )


# A session folder names the server that owns it: "PID STARTTIME" (the start time tells a
# reused pid apart). A server killed with SIGKILL cannot remove its folder; the next one does.
_OWNER = "owner"


def _owner_of(pid: int) -> str:
    """``"PID STARTTIME"`` for a running process, ``""`` if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    fields = stat[stat.rfind(b")") + 2 :].split()
    return f"{pid} {int(fields[19])}" if len(fields) > 19 else ""


_this: tuple[int, str] = (0, "")


def _this_server() -> str:
    """:func:`_owner_of` this process (read once: a server opens a session per call)."""
    global _this
    pid = os.getpid()
    if _this[0] != pid:
        _this = pid, _owner_of(pid)
    return _this[1]


def remove_stale_session_dirs(bases: Sequence[Path]) -> list[Path]:
    """Remove our session folders whose owning server is gone; returns them. A folder whose
    owner is alive, or that names no owner (being created, or older execgate), stays."""
    removed = []
    prefix = f"execgate-{os.getuid()}-"
    for base in bases:
        try:
            entries = [e for e in os.scandir(base) if e.name.startswith(prefix)]
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
                    continue
                owner = (Path(entry.path) / _OWNER).read_text().strip()
            except (OSError, UnicodeDecodeError):
                continue
            pid, _, _ = owner.partition(" ")
            if not pid.isdigit() or _owner_of(int(pid)) == owner:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _in_place_from_writable_repository(
    exec_: GatedExec, action: Action, confined: bool, sandbox: SandboxSpec | None
) -> Action:
    """An escalation out of a sandbox that can write the git repository it would start in
    runs in place instead: an escalated program (git, or whatever runs git) would run that
    repository's hooks and config outside (gate/gitrepo.py)."""
    if not confined or action.verdict != Verdict.ESCALATE:
        return action
    known = sandbox.known_carveouts if sandbox is not None else None
    dot_git = sandbox_writable_repository(exec_.pid, exec_.cwd, known)
    if dot_git is None:
        return action
    return replace(
        action,
        verdict=Verdict.RUN,
        reason=f"not escalated: it would start in the git repository {dot_git}, which the "
        "sandbox can write (its hooks and config would run outside the sandbox)",
    )


def _writable_folders(sandbox: SandboxSpec | None) -> tuple[str, ...]:
    """The canonical folders a confined process of ``sandbox`` can write in (none: a
    sandbox that writes nowhere, or none)."""
    if sandbox is None or sandbox.mode != "workspace-write":
        return ()
    return tuple(dict.fromkeys(os.path.realpath(root) for root in sandbox.writable_roots))


def _written_by_the_sandbox(exec_: GatedExec, sandbox: SandboxSpec, search_path: str) -> str | None:
    """A path deciding what ``exec_`` runs that a confined process could have made or
    re-pointed ("" for a file whose path is unknown), or None (``search_path``: the one the
    exec was judged with)."""
    paths = paths_that_decide(exec_, search_path=search_path)
    return "" if "" in paths else sandbox.first_writable(paths)


@dataclass(frozen=True)
class SessionConfig:
    r"""How a session is opened: one value, passed once. Two sessions opened with equal
    :attr:`key`\ s are interchangeable (:class:`SessionReserve` relies on it)."""

    live: LivePolicy
    escalation: PolicyEscalation
    sandbox: SandboxSpec | None = None
    #: The environment the session starts from (default: the server's own, at open()).
    base_env: Mapping[str, str] | None = None
    gate_escalated: bool = True
    approval_timeout: float = 300.0
    #: The launcher (and so the whole tree) gets a process session of its own, detached from
    #: any terminal (the MCP server); otherwise it stays in ours.
    new_process_session: bool = False
    clean_escalated_env: tuple[str, ...] = ()
    #: A terminal (PTY follower) the launcher makes its controlling terminal (needs
    #: ``new_process_session``): the main program, started with ``pgid=0``, gets it.
    terminal: int | None = None
    #: How connections through the proxy are decided (a sandbox with ``network_proxy``).
    network: NetworkSettings | None = None
    #: The shell a spare starts ahead of its call (gate/held.py), or None.
    held_shell: str | None = None

    def __post_init__(self) -> None:
        if self.base_env is not None:
            object.__setattr__(self, "base_env", MappingProxyType(dict(self.base_env)))
        object.__setattr__(self, "clean_escalated_env", tuple(self.clean_escalated_env))

    @functools.cached_property
    def key(self) -> tuple[object, ...]:
        env = self.base_env
        return (
            id(self.live),
            id(self.escalation),
            self.sandbox,
            None if env is None else tuple(sorted(env.items())),
            self.gate_escalated,
            self.approval_timeout,
            self.new_process_session,
            self.clean_escalated_env,
            self.terminal,
            self.network,
            self.held_shell,
        )

    @functools.cached_property
    def cleaned(self) -> CleanedVariables:
        """What escalated programs never take from their caller (once per configuration)."""
        return cleaned_variables(self.clean_escalated_env)


@dataclass(frozen=True)
class SessionCaller:
    """Whoever starts the session's command: who answers its questions, who is told when one
    starts and ends (``on_ask(True)`` / ``on_ask(False)``), where its decisions are logged."""

    asker: Asker
    on_ask: Callable[[bool], None] | None = None
    decisions: DecisionLog | None = field(default=None, compare=False)
    call: int | None = None  # the tool call its decisions are logged under


@dataclass(frozen=True)
class AdoptedParts:
    """What the native front of ``execgate run`` opened before this server started
    (docs/protocol.md §8): the session folder with its snapshot file, the tokens, the gate
    socket (listening), the sealed snapshot's descriptor, and the launcher with the session's
    command already spawned (``main``)."""

    dir: Path
    token: str
    escalated_token: str
    listener: socket.socket
    snapshot_fd: int | None  # None: a confined session (its clients read the file)
    launcher: Launcher
    main: asyncio.Future[LaunchedProcess]
    standins: Sequence[str] = ()  # the programs the front covered (standins/0, 1, …)


class EscalationSession:
    """Create with :meth:`open` (or :meth:`adopt`); always :meth:`aclose` (or use
    ``async with``)."""

    def __init__(
        self,
        config: SessionConfig,
        caller: SessionCaller | None,
        adopted: AdoptedParts | None = None,
    ) -> None:
        self.config = config
        self.live = config.live
        self.escalation = config.escalation
        sandbox = config.sandbox
        if sandbox is not None and sandbox.confines and sandbox.known_carveouts is None:
            # the `.git` folders there now, before anything of the session runs: the only
            # read-only ones an escalation trusts (gate/gitrepo.py, native/gitrepo.h)
            found = existing_carveouts(sandbox.writable_roots, sandbox.protected_names)
            sandbox = replace(sandbox, known_carveouts=found)
        self.sandbox = sandbox
        self.confined = sandbox is not None and sandbox.confines
        self.base_env = dict(os.environ if config.base_env is None else config.base_env)
        self.gate_escalated = config.gate_escalated
        self.cleaned = config.cleaned
        self.approval_timeout = config.approval_timeout
        self.token = adopted.token if adopted else secrets.token_hex(16)
        self.escalated_token = adopted.escalated_token if adopted else secrets.token_hex(16)
        # Set once, before anything of the session runs (None: a reserve's spare, see attach).
        self._caller = caller
        self._closing = False
        # set once aclose() is done; asyncio's, as `execgate run` does not import anyio
        self.closed = asyncio.Event()
        # set once the session's user is done with it (release(), or aclose()): SessionReserve
        # opens the next spare then
        self.released = asyncio.Event()
        self._asking: set[anyio.CancelScope] = set()
        self._asks = 0
        self.verdicts: Counter[Verdict] = Counter()  # decisions so far (a summary's counts)
        if adopted is not None:
            self.dir = adopted.dir
        else:
            self.dir = make_session_dir(sandbox.writable_roots if sandbox else ())
        self.socket_path = self.dir / "gate.sock"
        self.claim_path = self.dir / "claim.sock"  # the launcher's (protocol §4)
        self.snapshot_path = self.dir / "policy.snap"
        live = config.live
        # Without a sandbox a gated process could replace the file: clients use a sealed copy.
        self.sealed_snapshot: SealedSnapshot | None
        if adopted is not None:  # the front wrote both; the front end checks they are ours
            fd = adopted.snapshot_fd
            self.sealed_snapshot = None if fd is None else SealedSnapshot.adopt(fd)
        else:
            write_atomically(self.snapshot_path, live.snapshot, mode=0o444)
            self.sealed_snapshot = None if self.confined else SealedSnapshot(live.snapshot)
        # Escalated programs run outside the sandbox: their snapshot also lists the folders
        # it can write, so that a program found there asks (_where_it_runs).
        self._ask_folders = _writable_folders(sandbox) if self.gate_escalated else ()
        self.escalated_snapshot = (
            SealedSnapshot(with_ask_folders(live.snapshot, self._ask_folders))
            if self._ask_folders
            else None
        )
        self._unsubscribe = live.subscribe(self.publish_snapshot)
        self.interposer = native.native_path(native.INTERPOSER)
        self.wrapper = native.native_path(native.WRAPPER)
        # Inside a sandbox the programs rules name are covered by stand-ins (the kernel backstop).
        self.standins: StandIns | None = None
        if self.confined:
            try:
                made = adopted.standins if adopted is not None else None
                self.standins = StandIns(self.dir / "standins", self.wrapper, made)
                if adopted is None:  # the front's cover what its plan says (checked then)
                    self.standins.cover(live.rule_named)
            except BaseException:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
        self._server: GateServer | None = None
        self._launcher: Launcher | None = None
        self._held: HeldShell | None = None  # the shell started ahead of the call (hold())
        self._env_rules: EnvRules | None = None
        self._authorizations: dict[tuple[object, ...], Authorization] = {}
        self._tickets = Tickets()
        self._standing: Standing | None = None  # made at the first standing authorization
        self._unrevoke: Callable[[], None] | None = None
        # Network through the proxy: the proxy's thread, and what points programs at it.
        self.proxied = self.confined and sandbox is not None and sandbox.network_proxy
        self.network = config.network  # None: NetworkSettings()
        self.proxy_env = proxy_variables(PROXY_PORT) if self.proxied else {}
        self._proxy: ProxyThread | None = None
        self.network_gate: NetworkGate | None = None

    @classmethod
    async def open(
        cls, config: SessionConfig, caller: SessionCaller | None = None
    ) -> EscalationSession:
        """Open a session: its folder, gate socket and launcher. ``caller`` None: attach one
        with :meth:`attach` before :meth:`start`."""
        native.verify_installation()  # never load an interposer that is not the installed one
        session = cls(config, caller)
        live = config.live
        new_process_session = config.new_process_session
        try:
            live.watch_in(asyncio.get_running_loop())
            session._server = GateServer(session.socket_path, session)
            spec = session.confinement()
            report = session._start_proxy() if session.proxied else None
            try:
                session._launcher = await Launcher.start(
                    spec,
                    new_session=new_process_session,
                    claim_path=session.claim_path,
                    terminal=config.terminal,
                    proxy_report=report.fileno() if report else None,
                )
            finally:
                if report is not None:
                    report.close()  # the launcher's now: its end closes with it
        except BaseException:
            await session.aclose()
            raise
        return session

    def confinement(self) -> SandboxSpec | None:
        """What the launcher enforces: the session's sandbox with what the gate needs in it
        (execgate's own files, state and controls, the session folder, the stand-ins)."""
        sandbox = self.sandbox
        if sandbox is None:
            return None
        from execgate.sandbox.guarded import guard  # (sysconfig: sandboxes only)

        readonly, hidden = guard(sandbox)  # execgate's own files, state and controls
        hosts = self.network.hosts_file if self.network else None
        if hosts is not None and hosts.exists():  # read at every proxied connection
            readonly.append(hosts)
        return sandbox.with_gate_paths(
            session_dir=self.dir,
            executables=[self.wrapper, self.interposer],
            readonly=readonly,
            hidden=hidden,
            standin_table=self.standins.table if self.standins else None,
        )

    @classmethod
    def adopt(
        cls, config: SessionConfig, caller: SessionCaller, parts: AdoptedParts
    ) -> EscalationSession:
        """The session the native front opened (docs/protocol.md §8), served from here on:
        its gate socket, snapshot, stand-ins and launcher are ``parts``; a confined one's
        sandbox comes with the known carve-outs the front found (``known_carveouts``)."""
        sandbox = config.sandbox
        if sandbox is not None and sandbox.confines and sandbox.known_carveouts is None:
            raise ValueError("an adopted confined session takes the front's known carve-outs")
        session = cls(config, caller, parts)
        try:
            config.live.watch_in(asyncio.get_running_loop())
            session._server = GateServer(session.socket_path, session, listener=parts.listener)
            session._launcher = parts.launcher
        except BaseException:
            parts.listener.close()
            raise
        remove_stale_session_dirs(_session_dir_candidates())  # as make_session_dir does
        return session

    def attach(self, caller: SessionCaller) -> None:
        """Give a session opened without a caller (a reserve's spare) its caller, once."""
        if self._caller is not None:
            raise RuntimeError("the session has a caller already")
        self._caller = caller

    @property
    def caller(self) -> SessionCaller:
        if self._caller is None:
            raise RuntimeError("the session has no caller (attach one before start)")
        return self._caller

    @property
    def decisions(self) -> DecisionLog | None:
        return self._caller.decisions if self._caller is not None else None

    @property
    def call(self) -> int | None:
        return self._caller.call if self._caller is not None else None

    def _start_proxy(self) -> socket.socket:
        """Start the proxy's thread; returns the launcher's end of the report socket."""
        from execgate.gate.network import NetworkGate, NetworkSettings, listener_pair
        from execgate.netproxy.server import NetProxy, ProxyThread

        loop = asyncio.get_running_loop()
        self.network_gate = NetworkGate(
            settings=self.network or NetworkSettings(),
            policy=lambda: self.live.policy,
            fail_closed_reason=lambda: self.live.fail_closed_reason,
            ask=lambda request: asyncio.run_coroutine_threadsafe(self.ask_human(request), loop),
            record=lambda entry: loop.call_soon_threadsafe(self._record_connection, entry),
            proxy_port=PROXY_PORT,
        )
        ours, theirs = listener_pair()
        self._proxy = ProxyThread(NetProxy(self.network_gate), ours)
        return theirs

    def _record_connection(self, entry: dict[str, Any]) -> None:
        """Every decision on a connection through the proxy (the one call site): the decision
        log's ``kind: permission`` record, ``permission: network``, the host, port, protocol,
        rule, addresses and (refusals, prompts) the process in ``detail``."""
        if entry["decision"] != "allow":
            log.info("proxy: %s", entry.get("reason"))
        if self.decisions is not None:
            record = permission_entry(
                call=self.call,
                permission="network",
                detail=entry["detail"],
                decision=entry["decision"],
                source=entry["source"],
                answer=entry.get("answer"),
                answered_by=entry.get("answered_by"),
                reason=entry.get("reason"),
            )
            for key in ("rule_line", "rule_file"):  # an "always": the grant it wrote
                if key in entry:
                    record[key] = entry[key]
            self.decisions.record(record)

    async def __aenter__(self) -> EscalationSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- environment ---------------------------------------------------------------------

    def gate_env(self, *, escalated: bool = False) -> dict[str, str]:
        """The variables every gated process carries (protocol §1)."""
        wrapper = os.fspath(self.wrapper)
        snapshot = (self.escalated_snapshot if escalated else None) or self.sealed_snapshot
        return {
            "EXECGATE_SOCKET": os.fspath(self.socket_path),
            "EXECGATE_TOKEN": self.escalated_token if escalated else self.token,
            "EXECGATE_WRAPPER": wrapper,
            "EXEC_WRAPPER": wrapper,
            "BASH_EXEC_WRAPPER": wrapper,
            **({"EXECGATE_SNAPSHOT": snapshot.path} if snapshot else {}),
        }

    def _with_preload(self, value: str | None) -> str:
        ours = os.fspath(self.interposer)
        others = [p for p in (value or "").replace(" ", ":").split(":") if p and p != ours]
        return ":".join([ours, *others])

    def environment(self, env: Mapping[str, str], *, escalated: bool = False) -> list[bytes]:
        """``env`` plus the gate: the environment for a process of this session."""
        merged = {k: v for k, v in env.items() if k not in GATE_VARIABLES}
        if not escalated:  # escalated programs are outside: the proxy is not theirs
            merged.update(self.proxy_env)
        merged.update(self.gate_env(escalated=escalated))
        merged["LD_PRELOAD"] = self._with_preload(env.get("LD_PRELOAD"))
        return [os.fsencode(f"{k}={v}") for k, v in merged.items()]

    def escalated_env_rules(self) -> EnvRules:
        """How a caller's environment becomes its escalated program's (the launcher applies
        them to the claimer's environment): the variables that load other code or config
        (``self.cleaned``: ``LD_*``, ``GIT_CONFIG*``, ``BASH_ENV``, ``PYTHONPATH``, …) keep only
        the value the session started with, never the caller's; the gate is re-added with the
        escalated token (or removed, when escalated programs leave the gate, keeping only the
        user's own ``LD_PRELOAD``)."""
        if self._env_rules is None:
            cleaned = self.cleaned
            # The session's own values of the cleaned variables replace whatever the caller
            # made of them (SET); the caller's are dropped (DROP, DROP_PREFIXES).
            # The proxy variables likewise: an escalated program (outside, not proxied) gets
            # the session's own values, not the sandbox's proxy.
            proxy = PROXY_VARIABLE_NAMES if self.proxied else ()
            overlay = {
                k: v
                for k, v in self.base_env.items()
                if (cleaned.covers(k) or k in proxy)
                and k not in GATE_VARIABLES
                and k != "LD_PRELOAD"
            }
            user_preload = self.base_env.get("LD_PRELOAD")
            if self.gate_escalated:
                overlay.update(self.gate_env(escalated=True))
                overlay["LD_PRELOAD"] = self._with_preload(user_preload)
            elif user_preload:
                overlay["LD_PRELOAD"] = user_preload
            drop = dict.fromkeys([*GATE_VARIABLES, "LD_PRELOAD", *sorted(cleaned.names), *proxy])
            self._env_rules = EnvRules(
                drop=tuple(os.fsencode(name) for name in drop),
                drop_prefixes=tuple(os.fsencode(prefix) for prefix in cleaned.prefixes),
                set=tuple(os.fsencode(f"{k}={v}") for k, v in overlay.items()),
            )
        return self._env_rules

    def confined_env_rules(self) -> EnvRules:
        """A confined claim's environment: the caller's, with the gate re-added as every exec
        inside the sandbox gets it (protocol §1), and the proxy variables of a proxied session
        likewise."""
        preload = self._with_preload(self.base_env.get("LD_PRELOAD"))
        overlay = {**self.proxy_env, **self.gate_env(), "LD_PRELOAD": preload}
        proxy = PROXY_VARIABLE_NAMES if self.proxied else ()
        return EnvRules(
            drop=tuple(os.fsencode(name) for name in (*GATE_VARIABLES, "LD_PRELOAD", *proxy)),
            drop_prefixes=(),
            set=tuple(os.fsencode(f"{k}={v}") for k, v in overlay.items()),
        )

    # -- policy updates ------------------------------------------------------------------

    def publish_snapshot(self, snapshot: bytes) -> None:
        if self.standins is not None:  # before the snapshot: a new rule's program is covered
            self.standins.cover(self.live.rule_named)
        write_atomically(self.snapshot_path, snapshot, mode=0o444)
        if self.sealed_snapshot is not None:
            self.sealed_snapshot.publish(snapshot)
        if self.escalated_snapshot is not None:
            self.escalated_snapshot.publish(with_ask_folders(snapshot, self._ask_folders))

    # -- the main program ----------------------------------------------------------------

    @property
    def launcher(self) -> Launcher:
        assert self._launcher is not None, "session not open"
        return self._launcher

    @property
    def emptied(self) -> bool:
        """The launcher said nothing of the session is left (protocol §7 ``ended``): what
        :meth:`aclose` still does is only our own clean-up."""
        return self._launcher is not None and self._launcher.ended

    def flush_records(self) -> None:
        """Write the session's decisions now (:meth:`aclose` does it too)."""
        if self._standing is not None:
            self._standing.drain()  # claims the launcher reported and we did not read yet
        _unlogged.flush()
        if self.decisions is not None:
            self.decisions.flush()  # the log is the front end's; its records are written now

    def release(self) -> None:
        """Say the session's user is done with it (nothing of it runs any more; only its
        clean-up is left): a reserve that handed it out opens the next spare now."""
        self.released.set()

    async def start(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdio: Mapping[int, int],
        pgid: int = -1,
    ) -> LaunchedProcess:
        """Gate and start the session's own command (as if the session exec'd it). The session
        ends with it: once it and everything it left have exited, the launcher exits by itself,
        and nothing more can be spawned (front ends close the session then)."""
        held, self._held = self._held, None
        contents = self.live.current_contents()
        if held is not None and (
            held.argv[0] != os.fsencode(argv[0]) or held.contents is not contents
        ):
            held.discard()  # another shell, or judged with other contents (the rest: release)
            held = None
        if held is not None:
            exec_, judged = replace(held.exec_, argv=tuple(argv), cwd=cwd), held.judged
        else:
            program = resolve_command(argv[0], cwd=cwd, path=env.get("PATH", os.defpath))
            exec_, judged = open_exec(program, argv, cwd=cwd, via="session", contents=contents)
        try:
            return await self._start_judged(
                exec_, judged[-1], cwd=cwd, env=env, stdio=stdio, pgid=pgid, held=held
            )
        finally:
            _close_all(judged)

    async def hold(self, shell: str) -> None:
        """Start ``shell`` now, held until :meth:`start` brings its call (gate/held.py). Does
        nothing when it cannot (a script, a launcher error): :meth:`start` spawns then."""
        cwd = "/"
        program = resolve_command(shell, cwd=cwd, path=self.base_env.get("PATH", os.defpath))
        contents = self.live.current_contents()
        try:
            exec_, judged = open_exec(program, [shell], cwd=cwd, via="session", contents=contents)
        except ExecgateError as exc:  # the call will say so
            log.debug("no held shell for this session: %s", exc)
            return
        if exec_.interpreters:  # a script: its interpreter's argv is not the shell's
            _close_all(judged)
            return
        argv = held_placeholder_argv(os.fsencode(shell))
        env = held_placeholder_env(self.environment({**self.base_env, "PWD": cwd}))
        # Before the spawn: a change after this is a change after the set-up began.
        snapshot, layout = self.live.snapshot, self._layout()
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            process = await self.launcher.spawn(
                path=os.fsencode(exec_.path),
                argv=argv,
                env=env,
                cwd=os.fsencode(cwd),
                fds={0: devnull, 1: devnull, 2: devnull},
                sandboxed=self.confined,
                main=True,
                program=judged[-1],
                held=True,
            )
        except (LauncherError, OSError) as exc:
            log.debug("no held shell for this session: %s", exc)
            _close_all(judged)
            return
        finally:
            os.close(devnull)
        self._held = HeldShell(
            process, exec_, judged, contents, snapshot, layout, argv, env, self.confined
        )

    def _layout(self) -> tuple[object, ...]:
        """What this session's confined spawns are set up from, now."""
        spec = self.launcher.sandbox
        return spec.layout_now() if spec is not None else ()

    async def _start_judged(
        self,
        exec_: GatedExec,
        judged: int,
        *,
        cwd: str,
        env: Mapping[str, str],
        stdio: Mapping[int, int],
        pgid: int,
        held: HeldShell | None = None,
    ) -> LaunchedProcess:
        """Decide ``exec_`` and start it: the launcher executes ``judged`` (the descriptor of
        the file that was judged; for a script, its last interpreter), never a path; or
        releases ``held``, exec'd from ``judged``, when the call fits it."""
        asked = None
        if self.live.fail_closed_reason:  # nothing runs, not even a shell's builtins
            action = Action(Verdict.DENY, self.live.fail_closed_reason)
        else:
            action = self.escalation.decide(exec_, confined=self.confined)
        if action.verdict == Verdict.ASK:
            assert action.approval is not None
            request = action.approval
            action, approval = await self._ask(request, confined=self.confined)
            asked = (request, approval)
        self._record(exec_, action, asked)
        if action.verdict == Verdict.DENY:
            if held is not None:
                held.kill()
            raise SessionDenied(self.denial(exec_, action.reason))
        escalate = action.verdict == Verdict.ESCALATE
        argv = [os.fsencode(a) for a in interpreted_argv(exec_)]
        child_env = (
            self.escalated_env_rules().apply(self.environment(env))
            if escalate
            else self.environment(env)
        )
        sandboxed = self.confined and not escalate
        if held is not None:
            fits = held.fits(argv, child_env, stdio, sandboxed=sandboxed, pgid=pgid)
            # Now, not at the call's start: a human may have been asked meanwhile.
            if fits and held.still_current(self.live.contents, self.live.snapshot, self._layout()):
                await self.launcher.release(
                    held.process,
                    argv=argv,
                    env=child_env,
                    cwd=os.fsencode(cwd),
                    fds=stdio,
                    last=True,
                )
                return held.process
            held.kill()  # not for this call: the judged file is spawned as usual
        return await self.launcher.spawn(
            path=os.fsencode(exec_.path),
            argv=argv,
            env=child_env,
            cwd=os.fsencode(cwd),
            fds=stdio,
            sandboxed=sandboxed,
            pgid=pgid,
            main=True,
            last=True,
            program=judged,
        )

    # -- exec requests (RequestHandler) ---------------------------------------------------

    @staticmethod
    def denial(exec_: GatedExec, reason: str) -> str:
        return f"execgate: denied: {exec_.display()}: {visible(reason, 2000)}"

    def answer_exec(self, request: ExecRequest, fds: Sequence[int], peer: Peer) -> Reply:
        """``fds``: the descriptors that came with the request (the program, then each
        interpreter); they stay the server's and remain open until the answer is sent."""
        if request.token == self.token.encode():
            confined = self.confined
        elif request.token == self.escalated_token.encode():
            confined = False
        else:
            log.warning("gate: request with a foreign token from pid %d", peer.pid)
            exec_ = GatedExec.from_request(request, _UNKNOWN_FILE, ())
            self._record(exec_, Action(Verdict.DENY, "request not from this session"), closed=True)
            return protocol.encode_deny(self.denial(exec_, "request not from this session"))
        claimed: Sequence[tuple[bytes, bytes]] = request.interpreters
        opened: list[int] = []  # descriptors opened here, for a stand-in's program
        standin: tuple[FileId, str] | None = None  # the stand-in it came through, its program
        if confined and self.standins is not None:
            try:
                substituted = self.standins.substitute(fds, claimed, os.fsdecode(request.cwd))
                if substituted is not None:
                    standin = self.standins.covered_by(fds[0])
            except OSError as exc:
                exec_ = GatedExec.from_request(request, _UNKNOWN_FILE, ())
                return protocol.encode_deny(
                    self.denial(exec_, f"the program cannot be opened ({exc.strerror})")
                )
            if substituted is not None:
                fds, claimed, opened = substituted
        try:
            answer = self._judge(
                request, fds, claimed, peer, confined, standin=bool(opened), through=standin
            )
        except BaseException:
            _close_all(opened)
            raise
        if opened:
            if isinstance(answer, bytes):
                _close_all(opened)
            else:
                answer = _closing_after(answer, opened)
        return answer

    def _judge(
        self,
        request: ExecRequest,
        fds: Sequence[int],
        claimed: Sequence[tuple[bytes, bytes]],
        peer: Peer,
        confined: bool,
        *,
        standin: bool,
        through: tuple[FileId, str] | None = None,
    ) -> Reply:
        """``through``: the stand-in a request came through (when it is the program), and
        the path of the program it covers."""
        try:
            contents = self.live.current_contents()
            program, interpreters = inspect_descriptors(fds, claimed, contents)
        except IdentityError as exc:
            exec_ = GatedExec.from_request(request, _UNKNOWN_FILE, ())
            log.info("gate: refused a request from pid %d: %s", peer.pid, exc)
            self._record(exec_, Action(Verdict.DENY, str(exc)), closed=True)
            return protocol.encode_deny(self.denial(exec_, str(exc)))
        exec_ = vouched(request, program, interpreters, peer.pid)
        if self.live.fail_closed_reason:
            action = Action(Verdict.DENY, self.live.fail_closed_reason)
        else:
            action = self.escalation.decide(exec_, confined=confined)
        if action.verdict == Verdict.ASK:
            assert action.approval is not None
            return self._ask_then_answer(
                exec_, request, fds[-1], action.approval, confined, standin=standin
            )
        decided = action
        action, inside = self._where_it_runs(exec_, action, confined)
        self._record(exec_, action)
        answer = self._encode(exec_, request, fds[-1], action, standin=standin or inside)
        if (
            action is decided
            and action.verdict == Verdict.ESCALATE
            and confined
            and through is not None
            and isinstance(answer, bytes)
            and answer.startswith(_ESCALATE_PAYLOAD, protocol.HEADER.size)
            and self.escalation.is_kept(exec_, action, confined=confined)
        ):
            self._stand(exec_, request, program, fds[-1], action, through)
        return answer

    def _where_it_runs(
        self, exec_: GatedExec, action: Action, confined: bool
    ) -> tuple[Action, bool]:
        """The decided action as this session carries it out (True: the launcher runs it
        inside the sandbox). An escalation that would start in a repository the sandbox can
        write runs in place instead (_in_place_from_writable_repository). An escalated
        program runs outside, and so does what it starts in place: unless the sandbox could
        have made (or re-pointed) a file that would run, which then runs inside the sandbox,
        as the sandbox's own exec of it would. A rule naming that very file still lets it out."""
        action = _in_place_from_writable_repository(exec_, action, confined, self.sandbox)
        if confined or not self.confined or action.verdict != Verdict.RUN:
            return action, False
        assert self.sandbox is not None
        written = _written_by_the_sandbox(exec_, self.sandbox, self.live.search_path)
        if written is None:
            return action, False
        judgement = action.judgement
        if judgement is not None and not self.escalation.why_not_outside(exec_, judgement):
            return action, False
        where = f"{written} is where the sandbox can write" if written else "its file is unknown"
        return replace(action, reason=f"run inside the sandbox: {where}"), True

    def _stand(
        self,
        exec_: GatedExec,
        request: ExecRequest,
        program: ExecFile,
        runs: int,
        action: Action,
        through: tuple[FileId, str],
    ) -> None:
        """Offer a standing authorization for claims of exactly this exec (gate/standing.py)."""
        if self._standing is None:
            self._standing = Standing(self.launcher, self.token, self.live.watch_fd(), self._stood)
            self._unrevoke = self.live.on_change(self._standing.revoke)
        env = self.escalated_env_rules()
        if self._standing.offer(exec_, request, program, runs, action, env, through):
            assert self.standins is not None  # (a request came through one)
            self.standins.mark_standing(through[1])

    def _stood(self, stood: Stood, granted: Granted | None) -> None:
        """The launcher took a standing claim: its decision record, as the server would have
        written it (read after the program started, with others reported meanwhile)."""
        if granted is None:
            log.warning(
                "gate: unknown standing authorization %d claimed by pid %d",
                stood.standing_id,
                stood.pid,
            )
            return
        exec_ = replace(granted.exec, pid=stood.pid, ppid=stood.ppid, via=STANDING_VIA)
        self._record(exec_, granted.action, when=stood.time)

    @functools.cached_property
    def sandbox_text(self) -> str:
        """The session's sandbox profile in one line (the decision log's ``sandbox``)."""
        return self.sandbox.describe() if self.sandbox else "off"

    def refused(self, peer: Peer, why: str) -> None:
        if self._standing is not None:
            self._standing.drain()  # the claims made before this come first
        if self.decisions is not None:
            call = self.call
            self.decisions.record(
                lambda: {"kind": "exec", "call": call, "pid": peer.pid, "decision": "deny",
                         "source": "fail-closed", "reason": why}
            )  # fmt: skip

    def _encode(
        self,
        exec_: GatedExec,
        request: ExecRequest,
        runs: int,
        action: Action,
        *,
        standin: bool = False,
    ) -> Reply:
        """``standin``: the request came through a stand-in, whose program is not reachable
        inside the sandbox: `run` means the launcher runs it there, confined."""
        if action.verdict == Verdict.RUN:
            return self._escalate(exec_, request, runs, confined=True) if standin else protocol.RUN
        if action.verdict == Verdict.ESCALATE:
            return self._escalate(exec_, request, runs)
        return protocol.encode_deny(self.denial(exec_, action.reason))

    def _record(
        self,
        exec_: GatedExec,
        action: Action,
        asked: tuple[ApprovalRequest, Approval] | None = None,
        *,
        closed: bool = False,
        when: float | None = None,
    ) -> None:
        """Log a decision: the escalations log and the decision log, both after the answer
        (``closed``: refused without judging, or with the policy failed closed; ``when``: the
        time it was made, if not now: a standing claim's)."""
        if when is None and self._standing is not None:
            self._standing.drain()  # the claims made before this decision come first
        self.verdicts[action.verdict] += 1
        if escalations.isEnabledFor(logging.INFO) and (
            action.verdict == Verdict.ESCALATE or (action.verdict == Verdict.RUN and action.reason)
        ):
            _unlogged.add(exec_, action, self.sandbox_text, when)
        if self.decisions is not None:
            closed = closed or (action.judgement is None and bool(self.live.fail_closed_reason))
            call, sandbox = self.call, self.sandbox_text
            self.decisions.record(
                lambda: decision_entry(exec_, action, asked, closed, call, sandbox), when
            )

    async def _ask_then_answer(
        self,
        exec_: GatedExec,
        request: ExecRequest,
        runs: int,
        approval: ApprovalRequest,
        confined: bool,
        *,
        standin: bool,
    ) -> bytes:
        action, answer_given = await self._ask(approval, confined=confined)
        action, inside = self._where_it_runs(exec_, action, confined)
        self._record(exec_, action, (approval, answer_given))
        answer = self._encode(exec_, request, runs, action, standin=standin or inside)
        return answer if isinstance(answer, bytes) else await answer

    async def _ask(self, request: ApprovalRequest, *, confined: bool) -> tuple[Action, Approval]:
        """Ask a human, then resolve the answer; returns the action and the answer it follows
        from."""
        approval = await self.ask_human(request)
        if self._standing is not None:  # an answer may approve for the session: all go
            self._standing.revoke()
        return self.escalation.resolve(request, approval, confined=confined), approval

    async def ask_human(self, request: ApprovalRequest) -> Approval:
        """Ask a human; a session that ends or a question nobody answers in time is a denial.
        (Also the proxy's, for a connection's question: it runs on the session's loop.)"""
        caller = self.caller
        if self._closing:
            return no_one_to_ask(request, "the session ended before anyone answered")
        self._asks += 1
        if self._asks == 1 and caller.on_ask:
            caller.on_ask(True)
        import anyio

        # aclose() cancels the scope; its deadline is the session's own backstop.
        scope = anyio.CancelScope(deadline=anyio.current_time() + self.approval_timeout)
        self._asking.add(scope)
        answered = None
        try:
            with scope:
                answered = await caller.asker.ask(request)
        finally:
            self._asking.discard(scope)
            self._asks -= 1
            if self._asks == 0 and caller.on_ask:
                caller.on_ask(False)
        if answered is not None:
            return answered
        if self._closing:
            return no_one_to_ask(request, "the session ended before anyone answered")
        return no_one_to_ask(request, f"nobody answered within {self.approval_timeout:g} s")

    # -- escalation ----------------------------------------------------------------------

    def _escalate(
        self, exec_: GatedExec, request: ExecRequest, runs: int, *, confined: bool = False
    ) -> Reply:
        """Authorize a ticket at the launcher, then hand it to the client, which claims it
        there (§4). The authorization is written to the launcher before the answer is sent,
        so it is always there first. ``runs``: the descriptor of the file that was judged
        and will run (the last interpreter, for a script); the launcher executes exactly it.
        ``confined``: the launcher runs it inside the sandbox (a stand-in's program that no
        rule lets out), with the caller's environment as a confined exec would have it."""
        ticket = self._tickets.next()
        try:
            posted = self.launcher.authorize(
                ticket, self._authorization(exec_, request.token, confined=confined), runs
            )
        except (LauncherError, ProtocolError) as exc:
            return self._cannot_escalate(exec_, exc)
        frame = protocol.encode_escalate(ticket)
        if not posted.done():  # the control channel is backed up: answer once it is written
            return self._answer_when_posted(exec_, posted, frame)
        error = posted.exception()
        return frame if error is None else self._cannot_escalate(exec_, error)

    def _authorization(self, exec_: GatedExec, token: bytes, *, confined: bool) -> Authorization:
        """What a ticket for ``exec_`` lets its claimer run. Loops escalate the same command
        over and over: built once per command shape (what goes into it but the descriptor,
        which travels with each ticket), at most :data:`_AUTHORIZATIONS_KEPT` kept."""
        key = (token, confined, exec_.path, exec_.realpath, exec_.cwd, exec_.argv)
        kept = self._authorizations.get(key) if not exec_.interpreters else None
        if kept is not None:
            return kept
        made = authorization(
            token=token,
            display=exec_.display(),
            path=os.fsencode(exec_.realpath or exec_.path),  # for messages
            # An escalated interpreter reads a script by its canonical path: the name the
            # caller used could be re-pointed (a symlink in the workspace) before it does.
            argv=[os.fsencode(word) for word in exec_.exec_argv(exec_.realpath)],
            cwd=os.fsencode(exec_.cwd),
            env=self.confined_env_rules() if confined else self.escalated_env_rules(),
            confined=confined,
        )
        if not exec_.interpreters:  # a script's chain is judged anew each time: not kept
            if len(self._authorizations) >= _AUTHORIZATIONS_KEPT:
                self._authorizations.clear()
            self._authorizations[key] = made
        return made

    async def _answer_when_posted(
        self, exec_: GatedExec, posted: Awaitable[None], frame: bytes
    ) -> bytes:
        try:
            await posted
        except LauncherError as exc:
            return self._cannot_escalate(exec_, exc)
        return frame

    def _cannot_escalate(self, exec_: GatedExec, error: BaseException) -> bytes:
        log.warning("gate: cannot escalate %s: %s", exec_.display(), error)
        self._record(exec_, Action(Verdict.DENY, f"cannot escalate ({error})"), closed=True)
        return protocol.encode_deny(self.denial(exec_, f"cannot escalate ({error})"))

    # -- the end -------------------------------------------------------------------------

    async def aclose(self, grace: float = 0.5) -> None:
        """Deny pending questions, kill every process of the session, remove its files."""
        self._closing = True
        if self._held is not None:  # never taken: the launcher's shutdown ends it
            _close_all(self._held.judged)
            self._held = None
        for scope in list(self._asking):
            scope.cancel()
        self._unsubscribe()
        if self._unrevoke is not None:
            self._unrevoke()
        if self._standing is not None:
            self._standing.revoke()
        await asyncio.sleep(0)  # let pending asks answer "denied" before the server closes
        if self._launcher is not None:
            await self._launcher.shutdown(grace)
        if self._server is not None:
            await self._server.aclose()
        if self._proxy is not None:  # its listeners' namespaces are gone: nothing is left
            await asyncio.get_running_loop().run_in_executor(None, self._proxy.stop)
            self._proxy = None
        if self._standing is not None:
            self._standing.close()  # (after the launcher: no claim is reported any more)
        self.flush_records()
        if self.sealed_snapshot is not None:
            self.sealed_snapshot.close()
        if self.escalated_snapshot is not None:
            self.escalated_snapshot.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.closed.set()
        self.release()


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


async def _closing_after(answer: Awaitable[bytes], fds: Sequence[int]) -> bytes:
    try:
        return await answer
    finally:
        _close_all(fds)


# -- the decision log ------------------------------------------------------------------------

# Who answered, as the decision log's ``source`` and ``answered_by`` say it.
_ANSWERED_BY = {"execgate": "unanswered", "execgate approvals": "approvals"}


def decision_entry(
    exec_: GatedExec,
    action: Action,
    asked: tuple[ApprovalRequest, Approval] | None,
    closed: bool,
    call: int | None,
    sandbox: str,
) -> dict[str, object]:
    """One decision as the decision log records it (built after the answer was sent)."""
    judgement = action.judgement
    approval = asked[1] if asked else None
    argv, cut = bounded_argv(list(exec_.argv))
    entry: dict[str, object] = {
        "kind": "exec",
        "call": call,
        "pid": exec_.pid,
        "ppid": exec_.ppid,
        "cwd": exec_.cwd,
        "program": exec_.realpath or exec_.path,
        "argv": argv,
        "argv_cut": cut or None,
        "via": exec_.via,
        "decision": action.verdict.value,
        "sandbox": sandbox,
    }
    if judgement is not None and judgement.decision is not None:
        entry["policy"] = judgement.decision.value
        entry["rule"] = judgement.rule_locations()
        entry["justification"] = judgement.justification()
        entry["command"] = bounded_argv(list(judgement.command))[0]
    by = _ANSWERED_BY.get(approval.by, approval.by) if approval else None
    if closed:
        entry["source"] = "fail-closed"
    elif approval is not None:
        entry["source"] = by
    elif action.granted:
        entry["source"] = "grant"
    else:
        entry["source"] = "rule" if judgement and judgement.decision else "none"
    entry["reason"] = action.reason or None
    if asked is not None:
        request, approval = asked
        entry["answer"] = approval.answer.value
        entry["answered_by"] = by
        entry["answer_reason"] = approval.reason  # the human's own words, if any
        entry["prefix"] = list(request.prefix)
        if approval.answer.value == "always" and request.offer_always:
            # what UserApprovals.record appended (the grant `execgate approvals` lists)
            entry["rule_line"] = allow_rule_line(request.prefix)
            entry["rule_file"] = str(paths.user_default_rules_file())
    return {k: v for k, v in entry.items() if v is not None}


# -- the session's own command ---------------------------------------------------------------


def resolve_command(name: str, *, cwd: str, path: str) -> str:
    """Find ``name`` like ``execvp``: a name with a slash is relative to ``cwd``; else PATH."""
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name))
    for directory in path.split(":"):
        candidate = os.path.join(cwd, directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise ExecgateError(f"{quote_word(name)}: command not found", exit_status=127)


def describe_exec(
    program: str,
    argv: Sequence[str],
    *,
    cwd: str,
    via: str,
    contents: ContentIndex = NO_CONTENTS,
) -> GatedExec:
    """A :class:`GatedExec` for a program execgate itself is about to start."""
    exec_, fds = open_exec(program, argv, cwd=cwd, via=via, contents=contents)
    _close_all(fds)
    return exec_


def open_exec(
    program: str,
    argv: Sequence[str],
    *,
    cwd: str,
    via: str,
    contents: ContentIndex = NO_CONTENTS,
) -> tuple[GatedExec, tuple[int, ...]]:
    """:func:`describe_exec`, and the descriptors of what was judged (the program, then each
    ``#!`` interpreter; the caller's to close): what runs is the last one, whatever the paths
    name by then."""
    try:
        opened = open_path(program, cwd, contents)
    except OSError as exc:  # as a shell says it: 127 not found, 126 found but cannot run
        found = os.path.lexists(os.path.join(cwd, program))
        raise ExecgateError(
            f"{quote_word(program)}: {exc.strerror}", exit_status=126 if found else 127
        ) from None
    file, interpreters = opened.file, opened.interpreters
    return GatedExec(
        path=program,
        realpath=file.realpath,
        dev=file.dev,
        ino=file.ino,
        argv=tuple(argv),
        cwd=cwd,
        interpreters=interpreters,
        pid=os.getpid(),
        ppid=os.getppid(),
        via=via,
        leaves_gate=runs_file(file, interpreters).leaves_gate,
        content_names=file.content_names,
    ), opened.fds


def interpreted_argv(exec_: GatedExec) -> list[str]:
    """The exec's argv as the kernel's binfmt_script hands it to the last ``#!`` interpreter
    (each level puts its interpreter's name and argument before the script's name, in place
    of ``argv[0]``): the argv of an exec of that interpreter's descriptor."""
    args, name = list(exec_.argv), exec_.path
    for interpreter in exec_.interpreters:
        extra = [interpreter.arg] if interpreter.arg else []
        args = [interpreter.name, *extra, name, *args[1:]]
        name = interpreter.name
    return args


class SessionReserve:
    """Sessions opened ahead of need (:data:`DEPTH` of them), so the next caller does not wait
    for a launcher.

    Sessions are interchangeable only when opened with the same :class:`SessionConfig` key;
    :meth:`take` hands out a spare when it matches (the first one ready, else the oldest) and
    opens the next ones in the background (in :meth:`running`'s task group) once the session
    it handed out is released (its user is done with it, or it has closed), or has run for
    :data:`REFILL_AFTER` seconds, one after the other: opening one costs milliseconds of this
    process's CPU (on the event loop) and of the machine's, which must not delay the call's own
    shell, its exit report or its answer, and should be over when the next call comes. Two
    are kept, so a caller that comes back at once still finds one ready; a caller arriving
    before any is ready takes the oldest at once. Spares have no caller: :meth:`take` attaches
    the taker's.
    """

    #: How many spares are kept.
    DEPTH = 2

    def __init__(self) -> None:
        self._spares: deque[_Opening] = deque()
        self._tasks: anyio.abc.TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SessionReserve]:
        """Spares are opened (and unused ones closed) in a task group living this long; every
        session still held here is closed on the way out."""
        import anyio

        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield self
            finally:
                self._tasks = None
                with anyio.CancelScope(shield=True):
                    await self.aclose()

    async def take(self, config: SessionConfig, caller: SessionCaller) -> EscalationSession:
        """A session as ``EscalationSession.open(config, caller)`` would give."""
        key = config.key
        # Each spare's own config decides, not the last taker's: takers interleave (a taker
        # that waited for its spare refills with its config after another took with another).
        for other in [spare for spare in self._spares if spare.config.key != key]:
            self._spares.remove(other)  # opened for other arguments: not ours to hand out
            self._start(other.close)
        session: EscalationSession | None = None
        if self._spares:
            ready = [spare for spare in self._spares if spare.ready]
            spare = ready[0] if ready else self._spares[0]
            self._spares.remove(spare)
            session = await spare.result()
        if session is None:
            session = await EscalationSession.open(config, caller)
        else:
            session.attach(caller)
        # In the next turn of the loop: the taker goes on to start its program first.
        asyncio.get_running_loop().call_soon(self._refill, config, session.released)
        return session

    def _refill(self, config: SessionConfig, after: _Signal) -> None:
        """Queue spares for ``config`` up to :data:`DEPTH`, the first opened once ``after`` is
        set, each next one once the one before it is open."""
        while self._tasks is not None and len(self._spares) < self.DEPTH:
            opening = _Opening(config, after=after)
            self._spares.append(opening)
            self._start(opening.run)
            after = opening.opened

    def prime(self, config: SessionConfig) -> None:
        """Open a spare for ``config`` now, while nobody waits (a front end that can tell what
        its first caller will ask for: the first call need not wait for a launcher)."""
        if not self._spares and self._tasks is not None:
            opening = _Opening(config)
            self._spares.append(opening)
            self._start(opening.run)

    def _start(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._tasks is not None:
            self._tasks.start_soon(work)

    async def aclose(self) -> None:
        while self._spares:
            await self._spares.popleft().close()


class _Signal(Protocol):
    """Something set once (an asyncio or anyio event)."""

    def wait(self) -> Awaitable[object]: ...


#: How long a spare waits for the session handed out before it to be released (a long call
#: gets the next spare while it still runs).
REFILL_AFTER = 0.25


class _Opening:
    """A session being opened in the background: its result (None if opening failed).
    ``after``: open it once this is set (or :data:`REFILL_AFTER` has passed, or someone wants
    the result)."""

    def __init__(self, config: SessionConfig, after: _Signal | None = None) -> None:
        import anyio

        self.config = config
        self._after = after
        self._waiting = anyio.CancelScope(deadline=anyio.current_time() + REFILL_AFTER)
        self._done = anyio.Event()
        self.opened = self._done  # set once it is open (or could not be)
        self._session: EscalationSession | None = None
        self._closed = False

    async def run(self) -> None:
        import anyio

        try:
            if self._after is not None:
                with self._waiting:
                    await self._after.wait()
                    # The front end writes the answer of the call that released the session
                    # in the turn of the loop after (rpc.Connection.send): it goes first, and
                    # its reader runs before this work (execgate.handoff).
                    await anyio.sleep(0)
                    give_way()
            if self._closed:  # given up before it was opened
                return
            session = await EscalationSession.open(self.config)
            if self.config.held_shell is not None:
                try:
                    await session.hold(self.config.held_shell)
                except BaseException:
                    await session.aclose()
                    raise
        except Exception:
            log.debug("could not open a spare session", exc_info=True)
        else:
            if self._closed:
                await session.aclose()
            else:
                self._session = session
        finally:
            self._done.set()

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    async def result(self) -> EscalationSession | None:
        if self._done.is_set():  # (no turn of the loop for a spare that is ready)
            return self._session
        self._waiting.cancel()  # needed now
        await self._done.wait()
        return self._session

    async def close(self) -> None:
        self._closed = True
        session = await self.result()
        self._session = None
        if session is not None:
            await session.aclose()
