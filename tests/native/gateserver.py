"""A stand-in for the execgate server, for testing the native side (interposer and wrapper).

A real Unix socket server speaking EG1 (docs/protocol.md §2-§4) in a thread, using the package's
own protocol module. Each test gives it a rule (request -> answer); it records every request.
It also plays the session launcher's claim socket (``claim.sock`` beside ``gate.sock``): for
escalations it really spawns the program itself, on the descriptors, environment and cwd it
received, forwards signals to it and reports its exit status, so the claim (in-process by the
interposer, or by the wrapper) is exercised end to end. It is a test double of the *server and
launcher* only: the interposer and the wrapper under test are the real compiled ones.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from execgate.gate import protocol as P
from execgate.gate.identity import IdentityError, inspect_descriptors

MSG_CMSG_CLOEXEC = 0x40000000


@dataclass(frozen=True)
class Run:
    pass


@dataclass(frozen=True)
class Deny:
    message: str


@dataclass(frozen=True)
class Escalate:
    pass


@dataclass(frozen=True)
class Raw:
    """Answer with these exact bytes (garbage tests)."""

    data: bytes


@dataclass(frozen=True)
class Close:
    """Close the connection without answering."""


@dataclass(frozen=True)
class Request:
    """An exec request as the server sees it: the client's fields, and what the server read
    from the descriptors that came with it (realpath, dev, ino, the #! chain)."""

    token: bytes
    via: str
    pid: int
    ppid: int
    cwd: bytes
    path: bytes
    argv: tuple[bytes, ...]
    realpath: bytes
    dev: int
    ino: int
    interp: bytes  # the script's own #! interpreter ("" for no script)
    interp_arg: bytes
    interpreters: tuple[tuple[bytes, bytes, bytes], ...]  # (name, arg, realpath) per level
    nfds: int
    refused: str  # why the descriptors were refused ("" if they were fine)

    @classmethod
    def received(cls, req: Request, fds: list[int]) -> Request:
        realpath, dev, ino, chain, refused = b"", 0, 0, (), ""
        try:
            program, interpreters = inspect_descriptors(fds, req.interpreters)
        except IdentityError as exc:
            refused = str(exc)
        else:
            realpath, dev, ino = os.fsencode(program.realpath), program.dev, program.ino
            chain = tuple(
                (os.fsencode(i.name), os.fsencode(i.arg), os.fsencode(i.file.realpath))
                for i in interpreters
            )
        first = req.interpreters[0] if req.interpreters else (b"", b"")
        return cls(
            token=req.token, via=req.via, pid=req.pid, ppid=req.ppid, cwd=req.cwd,
            path=req.path, argv=req.argv, realpath=realpath, dev=dev, ino=ino,
            interp=first[0], interp_arg=first[1], interpreters=chain, nfds=len(fds),
            refused=refused,
        )  # fmt: skip

    def runs(self) -> tuple[bytes, list[bytes]]:
        """The file that runs and its argv (the last interpreter for a script)."""
        if not self.interpreters:
            return self.realpath or self.path, list(self.argv) or [self.path]
        words = [self.path, *self.argv[1:]]
        for name, arg, _ in self.interpreters:
            words = [name, *([arg] if arg else []), *words]
        return self.interpreters[-1][2], words


Answer = Run | Deny | Escalate | Raw | Close
Rule = Callable[[Request], Answer]


def name_of(req: Request) -> str:
    return os.path.basename(os.fsdecode(req.realpath or req.path))


def deny_names(*names: str, escalate: tuple[str, ...] = ()) -> Rule:
    """Deny programs whose (real or given) basename is in names, escalate those in escalate.
    A script is judged by its interpreter too: the kernel starts the interpreter without an exec
    the interposer could see, so the server must look at INTERP."""

    def rule(req: Request) -> Answer:
        given = os.path.basename(os.fsdecode(req.path))
        real = name_of(req)
        interps = {os.path.basename(os.fsdecode(n)) for i in req.interpreters for n in (i[0], i[2])}
        if given in names or real in names or interps & set(names):
            cmd = " ".join(os.fsdecode(a) for a in req.argv)
            return Deny(f"execgate: denied: {cmd}: forbidden by test rule")
        if given in escalate or real in escalate:
            return Escalate()
        return Run()

    return rule


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def encode_snapshot(
    names: list[bytes] = (),  # type: ignore[assignment]
    files: list[tuple[int, int]] = (),  # type: ignore[assignment]
    *,
    flags: int = 0,
    sizes: list[int] = (),  # type: ignore[assignment]
    ask_folders: list[bytes] = (),  # type: ignore[assignment]
) -> bytes:
    """The §6 snapshot format, written independently of the server's encoder."""
    hashes = sorted({fnv1a64(n) for n in names})
    fl = sorted(set(files))
    sz = sorted(set(sizes))
    names_off = 64
    files_off = names_off + 8 * len(hashes)
    sizes_off = files_off + 16 * len(fl)
    header = b"EGSNAP1\0" + struct.pack("<IIII", flags, len(hashes), len(fl), len(sz))
    header += struct.pack("<QQQ", names_off, files_off, sizes_off)
    body = b"".join(struct.pack("<Q", h) for h in hashes)
    body += b"".join(struct.pack("<QQ", d, i) for d, i in fl)
    body += b"".join(struct.pack("<Q", s) for s in sz)
    folders_off = 64 + len(body) if ask_folders else 0
    header += struct.pack("<IIQ", len(ask_folders), 0, folders_off)
    body += b"".join(struct.pack("<I", len(f)) + f for f in ask_folders)
    return header + body


@dataclass
class Escalation:
    request: Request
    claim: P.ClaimRequest | None = None
    claimer_pid: int | None = None  # SO_PEERCRED of the claim connection
    claimer_exe: str | None = None  # what the claimer was running: the caller or the wrapper
    pid: int | None = None
    status: int | None = None
    signals: list[int] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # status is set


def recv_frame(conn: socket.socket) -> tuple[bytes, list[int]] | None:
    """One frame and the descriptors that came with its header; None on a clean EOF."""
    fds: list[int] = []
    header = b""
    while len(header) < 4:
        msg, anc, _flags, _ = conn.recvmsg(
            4 - len(header), socket.CMSG_SPACE(P.MAX_FDS * 4), MSG_CMSG_CLOEXEC
        )
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4]))
        if not msg:
            for fd in fds:
                os.close(fd)
            if header:
                raise P.ProtocolError("EOF inside a header")
            return None
        header += msg
    (length,) = P.HEADER.unpack(header)
    payload = b""
    while len(payload) < length:
        chunk = conn.recv(length - len(payload))
        if not chunk:
            raise P.ProtocolError("EOF inside a frame")
        payload += chunk
    return payload, fds


class GateServer:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.sock_path = self.dir / "gate.sock"
        self.claim_path = self.dir / "claim.sock"
        self.snap_path = self.dir / "policy.snap"
        self.token = secrets.token_hex(16)
        self.rule: Rule = lambda req: Run()
        self.requests: list[Request] = []
        self.escalations: list[Escalation] = []
        self.tickets: dict[bytes, Escalation] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.request_seen = threading.Condition(self.lock)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.sock_path))
        self.listener.listen(128)
        self.standing_claims = 0  # standing claims seen (each answered `miss`)
        self.claim_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.claim_listener.bind(str(self.claim_path))
        self.claim_listener.listen(128)
        self._stop_r, self._stop_w = os.pipe()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    # -- configuration -----------------------------------------------------------------

    def ask_always(self) -> None:
        self.write_snapshot(encode_snapshot(flags=1))

    def write_snapshot(self, data: bytes) -> None:
        tmp = self.dir / "policy.snap.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.snap_path)

    def env(
        self, wrapper: Path, preload: Path, base: dict[str, str] | None = None
    ) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(
            LD_PRELOAD=str(preload),
            EXECGATE_SOCKET=str(self.sock_path),
            EXECGATE_TOKEN=self.token,
            EXECGATE_WRAPPER=str(wrapper),
            EXEC_WRAPPER=str(wrapper),
            BASH_EXEC_WRAPPER=str(wrapper),
        )
        return env

    # -- inspection ----------------------------------------------------------------------

    def argvs(self) -> list[list[bytes]]:
        with self.lock:
            return [list(r.argv) for r in self.requests]

    def names(self) -> list[str]:
        with self.lock:
            return [name_of(r) for r in self.requests]

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()

    def wait_for_request(self, pred: Callable[[Request], bool], timeout: float = 30) -> Request:
        with self.request_seen:
            found: list[Request] = []

            def check() -> bool:
                found[:] = [r for r in self.requests if pred(r)]
                return bool(found)

            if not self.request_seen.wait_for(check, timeout):
                raise AssertionError("expected request never arrived")
            return found[0]

    def wait_escalation_started(self, timeout: float = 30) -> Escalation:
        with self.request_seen:
            ok = self.request_seen.wait_for(
                lambda: any(e.pid is not None for e in self.escalations), timeout
            )
            assert ok, "no escalated program started"
            return next(e for e in self.escalations if e.pid is not None)

    # -- serving -------------------------------------------------------------------------

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self.thread.join(10)
        self.listener.close()
        self.claim_listener.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _serve(self) -> None:
        while True:
            listeners = [self.listener, self.claim_listener]
            ready, _, _ = select.select([*listeners, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            for listener in listeners:
                if listener in ready:
                    conn, _ = listener.accept()
                    claims = listener is self.claim_listener
                    threading.Thread(target=self._handle, args=(conn, claims), daemon=True).start()

    def _handle(self, conn: socket.socket, claims: bool) -> None:
        try:
            with conn:
                got = recv_frame(conn)
                if got is None:
                    return
                payload, fds = got
                fields = P.split_payload(payload)
                if fields[0] == b"exec" and not claims:
                    try:
                        req = Request.received(P.parse_exec_request(fields), fds)
                    finally:
                        for fd in fds:
                            os.close(fd)
                    self._exec(conn, req)
                elif fields[0] == b"claim" and claims:
                    self._claim(conn, P.parse_claim(fields), fds)
                elif fields[0] == b"standing" and claims:
                    # This server authorizes nothing standing: every such claim asks (§4).
                    self.standing_claims += 1
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(P.encode("miss"))
                else:
                    for fd in fds:
                        os.close(fd)
                    where = "claim" if claims else "gate"
                    raise P.ProtocolError(f"unexpected {fields[0]!r} on the {where} socket")
        except Exception as exc:  # recorded, the test decides
            with self.lock:
                import traceback

                self.errors.append(repr(exc) + traceback.format_exc())

    def _exec(self, conn: socket.socket, req: Request) -> None:
        # the asking process may have died meanwhile (killed by the test)
        with contextlib.suppress(BrokenPipeError):
            self._answer(conn, req)

    def _answer(self, conn: socket.socket, req: Request) -> None:
        with self.request_seen:
            self.requests.append(req)
            self.request_seen.notify_all()
        if req.token != self.token.encode():
            conn.sendall(P.encode_deny("execgate: denied: wrong token"))
            return
        if req.refused:
            conn.sendall(P.encode_deny(f"execgate: denied: {req.refused}"))
            return
        answer = self.rule(req)
        if isinstance(answer, Run):
            conn.sendall(P.RUN)
        elif isinstance(answer, Deny):
            conn.sendall(P.encode_deny(answer.message))
        elif isinstance(answer, Escalate):
            ticket = secrets.token_hex(8)
            esc = Escalation(request=req)
            with self.lock:
                self.tickets[ticket.encode()] = esc
                self.escalations.append(esc)
            conn.sendall(P.encode_escalate(ticket))
        elif isinstance(answer, Raw):
            conn.sendall(answer.data)
        # Close: nothing

    def _claim(self, conn: socket.socket, claim: P.ClaimRequest, fds: list[int]) -> None:
        try:
            with self.lock:
                esc = self.tickets.pop(claim.ticket, None)
            if esc is None or claim.token != self.token.encode():
                conn.sendall(P.encode_deny("execgate: denied: unknown ticket"))
                return
            if len(fds) != len(claim.fd_numbers):
                conn.sendall(P.encode_deny("execgate: denied: descriptor count mismatch"))
                return
            esc.claim = claim
            esc.claimer_pid, _, _ = struct.unpack(
                "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )
            with contextlib.suppress(OSError):
                esc.claimer_exe = os.readlink(f"/proc/{esc.claimer_pid}/exe")
            req = esc.request
            # move the received descriptors out of the way, then place them at their numbers
            high = [fcntl_dup(fd) for fd in fds]
            pairs = zip(high, claim.fd_numbers, strict=True)
            actions = [(os.POSIX_SPAWN_DUP2, h, n) for h, n in pairs]
            env = {}
            for entry in claim.env:
                k, _, v = entry.partition(b"=")
                env[k] = v
            program, argv = req.runs()
            try:
                pid = os.posix_spawn(
                    program,
                    argv,
                    env,
                    file_actions=actions,
                    setsigdef=(signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGTERM),
                    setsigmask=(),
                )
            except OSError as exc:
                conn.sendall(P.encode_deny(f"execgate: denied: spawn failed: {exc.strerror}"))
                return
            finally:
                for h in high:
                    os.close(h)
            with self.request_seen:
                esc.pid = pid
                self.request_seen.notify_all()
            esc.started.set()
            pidfd = os.pidfd_open(pid)
            try:
                while True:
                    ready, _, _ = select.select([conn, pidfd], [], [])
                    if pidfd in ready:
                        break
                    got = recv_frame(conn)
                    if got is None:  # the wrapper is gone: kill the program
                        os.kill(pid, signal.SIGKILL)
                        break
                    payload, extra = got
                    for fd in extra:
                        os.close(fd)
                    sig = P.parse_signal(P.split_payload(payload))
                    esc.signals.append(sig)
                    os.kill(pid, sig)
            finally:
                os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            esc.status = status
            esc.ended.set()
            with contextlib.suppress(OSError):  # the claimer may be gone
                if os.WIFSIGNALED(status):
                    conn.sendall(P.encode_signal(os.WTERMSIG(status)))
                else:
                    conn.sendall(P.encode_exit(os.WEXITSTATUS(status)))
        finally:
            for fd in fds:
                os.close(fd)


def fcntl_dup(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
