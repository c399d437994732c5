"""One gated run: the socket, token, environment, launcher and every process it started.

:class:`EscalationSession` is what a front end (``execgate run``, one MCP ``shell`` call) opens
around the command it gates. Data flows one way: the :class:`GateServer` reads a request, the
session judges it with its :class:`EscalationPolicy` (asking a human through its
:class:`Asker` when policy says ``prompt``), and escalations are carried out by the session's
launcher. Closing the session denies pending questions, kills every process it started —
sandboxed, escalated, orphaned — and removes its files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from execgate import native
from execgate.errors import ExecgateError
from execgate.gate import protocol
from execgate.gate.channel import Channel, ChannelClosed
from execgate.gate.escalation import (
    Action,
    ApprovalRequest,
    Asker,
    EscalationPolicy,
    Verdict,
    no_one_to_ask,
)
from execgate.gate.launcher import LaunchedProcess, Launcher
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.program import GatedExec
from execgate.gate.protocol import ExecRequest, ProtocolError
from execgate.gate.server import Answer, GateServer, Peer
from execgate.gate.snapshot import write_atomically
from execgate.sandbox import SandboxSpec

log = logging.getLogger("execgate.session")

GATE_VARIABLES = (
    "EXECGATE_SOCKET",
    "EXECGATE_TOKEN",
    "EXECGATE_WRAPPER",
    "EXEC_WRAPPER",
    "BASH_EXEC_WRAPPER",
)
TICKET_LIFETIME = 30.0


class SessionDenied(ExecgateError):
    """The session's own command was denied (its message is the denial line)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_status=126)


@dataclass(frozen=True)
class _Ticket:
    exec: GatedExec
    program: bytes  # what to execute: the canonical path checked at decision time
    created: float


class AuditLog:
    """Every decision as one JSON line (``--audit FILE``)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8", buffering=1)

    def record(self, exec_: GatedExec, verdict: str, reason: str = "", **extra: object) -> None:
        entry = {
            "time": round(time.time(), 6),
            "pid": exec_.pid,
            "ppid": exec_.ppid,
            "via": exec_.via,
            "program": exec_.realpath or exec_.path,
            "argv": list(exec_.argv),
            "cwd": exec_.cwd,
            "verdict": verdict,
            **({"reason": reason} if reason else {}),
            **extra,
        }
        self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()


def _session_dir_candidates() -> list[Path]:
    candidates = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        candidates.append(Path(runtime))
    candidates += [Path("/dev/shm"), Path.home() / ".execgate" / "run", Path("/tmp")]
    return candidates


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
    for base in sorted(candidates, key=writable):  # stable: outside-the-sandbox ones first
        try:
            base.mkdir(parents=True, exist_ok=True)
            path = Path(tempfile.mkdtemp(prefix=f"execgate-{os.getuid()}-", dir=base))
        except OSError:
            continue
        if len(os.fsencode(path / "gate.sock")) < 100:  # sun_path limit
            return path
        shutil.rmtree(path, ignore_errors=True)
    raise ExecgateError(
        "found no folder for the session socket (tried $XDG_RUNTIME_DIR, /dev/shm, "
        "~/.execgate/run, /tmp)"
    )


class EscalationSession:
    """Create with :meth:`open`; always :meth:`aclose` (or use ``async with``)."""

    def __init__(
        self,
        *,
        live: LivePolicy,
        escalation: EscalationPolicy,
        asker: Asker,
        sandbox: SandboxSpec | None,
        base_env: Mapping[str, str],
        gate_escalated: bool,
        approval_timeout: float,
        audit: AuditLog | None,
        on_ask: Callable[[bool], None] | None,
    ) -> None:
        self.live = live
        self.escalation = escalation
        self.asker = asker
        self.sandbox = sandbox
        self.confined = sandbox is not None and sandbox.confines
        self.base_env = dict(base_env)
        self.gate_escalated = gate_escalated
        self.approval_timeout = approval_timeout
        self.token = secrets.token_hex(16)
        self.escalated_token = secrets.token_hex(16)
        self._audit = audit
        self._on_ask = on_ask
        self._tickets: dict[str, _Ticket] = {}
        self._escalated: set[LaunchedProcess] = set()
        self._closing = asyncio.Event()
        self._asks = 0
        self.dir = make_session_dir(sandbox.writable_roots if sandbox else ())
        self.socket_path = self.dir / "gate.sock"
        self.snapshot_path = self.dir / "policy.snap"
        write_atomically(self.snapshot_path, live.snapshot)
        self._unsubscribe = live.subscribe(self.publish_snapshot)
        self.interposer = native.native_path(native.INTERPOSER)
        self.wrapper = native.native_path(native.WRAPPER)
        self._server: GateServer | None = None
        self._launcher: Launcher | None = None

    @classmethod
    async def open(
        cls,
        *,
        live: LivePolicy,
        escalation: EscalationPolicy,
        asker: Asker,
        sandbox: SandboxSpec | None = None,
        base_env: Mapping[str, str] | None = None,
        gate_escalated: bool = True,
        approval_timeout: float = 300.0,
        audit: AuditLog | None = None,
        on_ask: Callable[[bool], None] | None = None,
        new_process_session: bool = False,
    ) -> EscalationSession:
        """Open a session: its folder, gate socket and launcher.

        ``new_process_session``: the launcher (and so the whole tree) gets its own process
        session, detached from any terminal (the MCP server); otherwise it stays in ours.
        """
        session = cls(
            live=live,
            escalation=escalation,
            asker=asker,
            sandbox=sandbox,
            base_env=os.environ if base_env is None else base_env,
            gate_escalated=gate_escalated,
            approval_timeout=approval_timeout,
            audit=audit,
            on_ask=on_ask,
        )
        try:
            session._server = GateServer(session.socket_path, session)
            spec = None
            if sandbox is not None:
                spec = sandbox.with_gate_paths(
                    session_dir=session.dir, executables=[session.wrapper, session.interposer]
                )
            session._launcher = await Launcher.start(spec, new_session=new_process_session)
        except BaseException:
            await session.aclose()
            raise
        return session

    async def __aenter__(self) -> EscalationSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- environment ---------------------------------------------------------------------

    def gate_env(self, *, escalated: bool = False) -> dict[str, str]:
        """The variables every gated process carries (protocol §1)."""
        wrapper = os.fspath(self.wrapper)
        return {
            "EXECGATE_SOCKET": os.fspath(self.socket_path),
            "EXECGATE_TOKEN": self.escalated_token if escalated else self.token,
            "EXECGATE_WRAPPER": wrapper,
            "EXEC_WRAPPER": wrapper,
            "BASH_EXEC_WRAPPER": wrapper,
        }

    def _with_preload(self, value: str | None) -> str:
        ours = os.fspath(self.interposer)
        others = [p for p in (value or "").replace(" ", ":").split(":") if p and p != ours]
        return ":".join([ours, *others])

    def environment(self, env: Mapping[str, str], *, escalated: bool = False) -> list[bytes]:
        """``env`` plus the gate: the environment for a process of this session."""
        merged = {k: v for k, v in env.items() if k not in GATE_VARIABLES}
        merged.update(self.gate_env(escalated=escalated))
        merged["LD_PRELOAD"] = self._with_preload(env.get("LD_PRELOAD"))
        return [os.fsencode(f"{k}={v}") for k, v in merged.items()]

    def _escalated_environment(self, raw_env: Sequence[bytes]) -> list[bytes]:
        """The caller's environment for its escalated program: dynamic-loader variables the
        caller set (that differ from the session's own environment) are dropped, and the gate
        is re-added (or removed, when escalated programs leave the gate)."""
        base = {os.fsencode(k): os.fsencode(v) for k, v in self.base_env.items()}
        kept: dict[bytes, bytes] = {}
        for entry in raw_env:
            name, sep, value = entry.partition(b"=")
            if not sep or name.decode("latin-1") in GATE_VARIABLES:
                continue
            if name.startswith(b"LD_") and base.get(name) != value and name != b"LD_PRELOAD":
                continue
            kept[name] = value
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in kept.items()}
        user_preload = self.base_env.get("LD_PRELOAD")
        if self.gate_escalated:
            env.pop("LD_PRELOAD", None)
            if user_preload:
                env["LD_PRELOAD"] = user_preload
            return self.environment(env, escalated=True)
        if user_preload:
            env["LD_PRELOAD"] = user_preload
        else:
            env.pop("LD_PRELOAD", None)
        return [os.fsencode(f"{k}={v}") for k, v in env.items()]

    # -- policy updates ------------------------------------------------------------------

    def publish_snapshot(self, snapshot: bytes) -> None:
        write_atomically(self.snapshot_path, snapshot)

    # -- the main program ----------------------------------------------------------------

    @property
    def launcher(self) -> Launcher:
        assert self._launcher is not None, "session not open"
        return self._launcher

    async def start(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        stdio: Mapping[int, int],
        pgid: int = -1,
    ) -> LaunchedProcess:
        """Gate and start the session's own command (as if the session exec'd it)."""
        program = resolve_command(argv[0], cwd=cwd, path=env.get("PATH", os.defpath))
        exec_ = describe_exec(program, argv, cwd=cwd, via="session")
        action = self.escalation.decide(exec_, confined=self.confined)
        if action.verdict == Verdict.ASK:
            assert action.approval is not None
            action = await self._ask(action.approval, confined=self.confined)
        self._record(exec_, action)
        if action.verdict == Verdict.DENY:
            raise SessionDenied(self.denial(exec_, action.reason))
        escalate = action.verdict == Verdict.ESCALATE
        return await self.launcher.spawn(
            path=os.fsencode(program),
            argv=[os.fsencode(a) for a in argv],
            env=self._escalated_environment(self.environment(env))
            if escalate
            else self.environment(env),
            cwd=os.fsencode(cwd),
            fds=stdio,
            sandboxed=self.confined and not escalate,
            pgid=pgid,
            main=True,
        )

    # -- exec requests (RequestHandler) ---------------------------------------------------

    @staticmethod
    def denial(exec_: GatedExec, reason: str) -> str:
        return f"execgate: denied: {exec_.display()}: {reason}"

    def answer_exec(self, request: ExecRequest, peer: Peer) -> Answer:
        exec_ = GatedExec.from_request(request)
        if request.token == self.token.encode():
            confined = self.confined
        elif request.token == self.escalated_token.encode():
            confined = False
        else:
            log.warning("gate: request with a foreign token from pid %d", peer.pid)
            return protocol.encode_deny(self.denial(exec_, "request not from this session"))
        if self.live.fail_closed_reason:
            action = Action(Verdict.DENY, self.live.fail_closed_reason)
        else:
            action = self.escalation.decide(exec_, confined=confined)
        if action.verdict == Verdict.ASK:
            assert action.approval is not None
            return self._ask_then_answer(exec_, action.approval, confined)
        self._record(exec_, action)
        return self._encode(exec_, action)

    def _encode(self, exec_: GatedExec, action: Action) -> bytes:
        if action.verdict == Verdict.RUN:
            return protocol.RUN
        if action.verdict == Verdict.ESCALATE:
            return protocol.encode_escalate(self._issue_ticket(exec_))
        return protocol.encode_deny(self.denial(exec_, action.reason))

    def _record(self, exec_: GatedExec, action: Action) -> None:
        if action.verdict == Verdict.ESCALATE:
            log.info("escalating %s (pid %d, cwd %s)", exec_.display(), exec_.pid, exec_.cwd)
        if self._audit:
            self._audit.record(exec_, action.verdict.value, action.reason)

    async def _ask_then_answer(
        self, exec_: GatedExec, request: ApprovalRequest, confined: bool
    ) -> bytes:
        action = await self._ask(request, confined=confined)
        self._record(exec_, action)
        return self._encode(exec_, action)

    async def _ask(self, request: ApprovalRequest, *, confined: bool) -> Action:
        """Ask a human; a session that ends or a question nobody answers in time is a denial."""
        self._asks += 1
        if self._asks == 1 and self._on_ask:
            self._on_ask(True)
        ask = asyncio.ensure_future(self.asker.ask(request))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            done, _ = await asyncio.wait(
                {ask, closing}, timeout=self.approval_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if ask in done:
                approval = ask.result()
            elif closing in done:
                approval = no_one_to_ask(request, "the session ended before anyone answered")
            else:
                approval = no_one_to_ask(
                    request, f"nobody answered within {self.approval_timeout:g} s"
                )
        finally:
            for task in (ask, closing):
                task.cancel()
            self._asks -= 1
            if self._asks == 0 and self._on_ask:
                self._on_ask(False)
        return self.escalation.resolve(request, approval, confined=confined)

    # -- escalation ----------------------------------------------------------------------

    def _issue_ticket(self, exec_: GatedExec) -> str:
        now = time.monotonic()
        for key in [k for k, t in self._tickets.items() if now - t.created > TICKET_LIFETIME]:
            del self._tickets[key]
        ticket = secrets.token_hex(16)
        program = exec_.realpath or exec_.path
        self._tickets[ticket] = _Ticket(exec_, os.fsencode(program), now)
        return ticket

    async def serve_claim(
        self, channel: Channel, fields: list[bytes], fds: list[int], peer: Peer
    ) -> None:
        process: LaunchedProcess | None = None
        try:
            try:
                claim = protocol.parse_claim(fields)
            except ProtocolError as exc:
                log.warning("gate: malformed claim from pid %d: %s", peer.pid, exc)
                return
            ticket = self._tickets.pop(claim.ticket.decode("ascii", "replace"), None)
            if claim.token not in (self.token.encode(), self.escalated_token.encode()):
                await channel.send(protocol.encode_deny("execgate: claim not from this session"))
                return
            if ticket is None or time.monotonic() - ticket.created > TICKET_LIFETIME:
                await channel.send(
                    protocol.encode_deny("execgate: escalation ticket unknown or expired")
                )
                return
            if len(fds) != len(claim.fd_numbers):
                await channel.send(protocol.encode_deny("execgate: descriptor count mismatch"))
                return
            try:
                pgid = os.getpgid(peer.pid)
            except OSError:
                pgid = 0
            try:
                process = await self.launcher.spawn(
                    path=ticket.program,
                    argv=[os.fsencode(a) for a in ticket.exec.argv],
                    env=self._escalated_environment(claim.env),
                    cwd=os.fsencode(ticket.exec.cwd),
                    fds=dict(zip(claim.fd_numbers, fds, strict=True)),
                    sandboxed=False,
                    pgid=pgid,
                )
            except ExecgateError as exc:
                await channel.send(
                    protocol.encode_deny(f"execgate: cannot run {ticket.exec.display()}: {exc}")
                )
                return
            finally:
                for fd in fds:
                    os.close(fd)
                fds = []
            self._escalated.add(process)
            status = await self._relay_until_exit(channel, process)
            code = os.waitstatus_to_exitcode(status)
            frame = protocol.encode_signal(-code) if code < 0 else protocol.encode_exit(code)
            with contextlib.suppress(OSError):
                await channel.send(frame)
        except (OSError, ChannelClosed):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            if process is not None:
                self._escalated.discard(process)
            channel.close()

    async def _relay_until_exit(self, channel: Channel, process: LaunchedProcess) -> int:
        """Wait for the escalated program, forwarding the wrapper's signals to it. If the
        wrapper goes away, the program it stood for is killed."""
        exited = asyncio.ensure_future(process.wait())
        incoming: asyncio.Future[tuple[list[bytes], list[int]]] | None = asyncio.ensure_future(
            channel.recv()
        )
        try:
            while True:
                waiting: set[asyncio.Future[object]] = {exited}  # type: ignore[arg-type]
                if incoming is not None:
                    waiting.add(incoming)  # type: ignore[arg-type]
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if exited.done():
                    return exited.result()
                assert incoming is not None
                try:
                    fields, stray = incoming.result()
                    for fd in stray:
                        os.close(fd)
                    process.signal(protocol.parse_signal(fields))
                    incoming = asyncio.ensure_future(channel.recv())
                except (ChannelClosed, ProtocolError, OSError):
                    process.signal(signal.SIGKILL)
                    incoming = None
        finally:
            if incoming is not None:
                incoming.cancel()
            if not exited.done():
                exited.cancel()

    # -- the end -------------------------------------------------------------------------

    async def aclose(self, grace: float = 0.5) -> None:
        """Deny pending questions, kill every process of the session, remove its files."""
        self._closing.set()
        self._unsubscribe()
        await asyncio.sleep(0)  # let pending asks answer "denied" before the server closes
        if self._launcher is not None:
            await self._launcher.shutdown(grace)
        if self._server is not None:
            await self._server.aclose()
        if self._audit:
            self._audit.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the session's own command ---------------------------------------------------------------


def resolve_command(name: str, *, cwd: str, path: str) -> str:
    """Find ``name`` like ``execvp``: a name with a slash is relative to ``cwd``; else PATH."""
    if "/" in name:
        return os.path.normpath(os.path.join(cwd, name))
    for directory in path.split(":"):
        candidate = os.path.join(cwd, directory or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise ExecgateError(f"{name}: command not found", exit_status=127)


def describe_exec(program: str, argv: Sequence[str], *, cwd: str, via: str) -> GatedExec:
    """A :class:`GatedExec` for a program execgate itself is about to start."""
    try:
        st = os.stat(program)
    except OSError as exc:
        raise ExecgateError(f"{program}: {exc.strerror}", exit_status=127) from None
    interp, interp_arg = "", ""
    with contextlib.suppress(OSError), open(program, "rb") as f:
        head = f.read(256)
        if head.startswith(b"#!"):
            line = head[2:].split(b"\n", 1)[0].strip()
            parts = line.split(None, 1)
            if parts:
                interp = os.fsdecode(parts[0])
                interp_arg = os.fsdecode(parts[1].strip()) if len(parts) > 1 else ""
    return GatedExec(
        path=program,
        realpath=os.path.realpath(program),
        dev=st.st_dev,
        ino=st.st_ino,
        argv=tuple(argv),
        cwd=cwd,
        interp=interp,
        interp_arg=interp_arg,
        pid=os.getpid(),
        ppid=os.getppid(),
        via=via,
    )
