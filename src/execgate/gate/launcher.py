"""The Python side of the ``execgate-launch`` control channel (docs/protocol.md §7).

One launcher per session: a subreaper that spawns every program of the session (the sandboxed
main program and each escalated one), reports the exits of what the server spawned, and kills
the whole tree when the session ends. ::

    launcher = await Launcher.start(spec, new_session=True, claim_path=dir / "claim.sock")
    try:
        proc = await launcher.spawn(path=b"/bin/bash", argv=[b"bash", b"-c", b"make"],
                                    env=env, cwd=b"/src", fds={0: 0, 1: w, 2: w},
                                    sandboxed=True, main=True)
        status = await proc.wait()          # raw wait(2) status
    finally:
        await launcher.shutdown()           # nothing of the session survives this

Escalations do not pass through here: :meth:`Launcher.authorize` posts a ticket, and the
claimer (interposer or wrapper) claims it at the launcher's claim socket directly (§4).
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import itertools
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from execgate.errors import ExecgateError
from execgate.gate import orphans
from execgate.gate.channel import Channel, ChannelClosed
from execgate.gate.protocol import (
    MAX_FDS,
    Authorization,
    Ended,
    EnvRules,
    LauncherEvent,
    ProtocolError,
    Spawned,
    SpawnFailed,
    encode_launcher_signal,
    encode_release,
    encode_revoke,
    encode_shutdown,
    encode_spawn,
    parse_launcher_event,
)
from execgate.native import INTERPOSER, LAUNCHER, WRAPPER, native_path
from execgate.sandbox.probe import require_support
from execgate.sandbox.spec import SandboxSpec

# How long shutdown() waits beyond the grace period before SIGKILLing a stuck launcher.
_STUCK_AFTER = 15.0
# How long an authorized escalation ticket can be claimed (protocol §4).
TICKET_LIFETIME = 30.0


async def _read_to_eof(fd: int) -> bytes:
    """Everything written to the pipe ``fd`` until EOF."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
            if not chunk:
                return data
            data += chunk
            continue
        except BlockingIOError:
            pass
        ready = loop.create_future()
        loop.add_reader(fd, ready.set_result, None)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


class Tickets:
    """Escalation tickets: 128 random bits each, as hex (a claimer that could guess another
    process's ticket could take its escalation over). Read from the kernel in batches: one
    ``getrandom`` per 64 tickets instead of one per escalation."""

    _BATCH = 64

    def __init__(self) -> None:
        self._random = b""

    def next(self) -> str:
        if not self._random:
            self._random = os.urandom(16 * self._BATCH)
        ticket, self._random = self._random[:16], self._random[16:]
        return ticket.hex()


def authorization(
    *,
    token: bytes,
    display: str,
    path: bytes,
    argv: Sequence[bytes],
    cwd: bytes,
    env: EnvRules,
    lifetime: float = TICKET_LIFETIME,
    confined: bool = False,
) -> Authorization:
    """What a ticket lets its claimer run (§7 ``authorize``), for any number of tickets: the
    claimer presenting ``token`` gets the judged descriptor executed with ``argv`` in ``cwd``
    (unconfined, or inside the sandbox when ``confined``), within ``lifetime`` seconds of the
    authorization, its environment passed through ``env``. ``path`` names the program and
    ``display`` the command in the launcher's messages (``execgate: cannot run DISPLAY: …``)."""
    return Authorization(
        lifetime_ms=max(0, round(lifetime * 1000)),
        token=token,
        display=display.replace("\n", " "),
        path=path,
        cwd=cwd,
        argv=argv,
        env=env,
        confined=confined,
    )


class LauncherError(ExecgateError):
    """The session launcher is gone or refused a request."""


class SpawnError(LauncherError):
    """Nothing ran: the exec, or the setup before it (chdir, sandbox), failed in the child."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno


class LaunchedProcess:
    """A program the launcher started. Its pid stays valid until :meth:`wait` returns (the
    launcher reaps it only then), so :meth:`signal` never hits a reused pid."""

    def __init__(self, launcher: Launcher, spawn_id: int, pid: int) -> None:
        self.pid = pid
        self.spawn_id = spawn_id
        self._launcher = launcher
        self._ended = asyncio.Event()
        self._status: int | None = None
        self._error: LauncherError | None = None

    def __repr__(self) -> str:
        return f"<LaunchedProcess pid={self.pid} status={self._status}>"

    @property
    def returncode(self) -> int | None:
        """The raw wait status once the process has ended, else None."""
        return self._status

    async def wait(self) -> int:
        """The raw wait(2) status (``os.waitstatus_to_exitcode`` converts it). Raises
        :class:`LauncherError` if the launcher died before reporting it."""
        await self._ended.wait()
        if self._error is not None:
            raise self._error
        assert self._status is not None
        return self._status

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (through the launcher; a no-op once it ended)."""
        if not 0 < signum < signal.NSIG:
            raise ValueError(f"bad signal number {signum}")
        if not self._ended.is_set():
            self._launcher._post(encode_launcher_signal(self.spawn_id, signum))

    def _exited(self, status: int) -> None:
        self._status = status
        self._ended.set()

    def _lost(self, error: LauncherError) -> None:
        if not self._ended.is_set():
            self._error = error
            self._ended.set()


class _Outgoing:
    """A frame on its way to the launcher (descriptors ride on its first byte)."""

    __slots__ = ("data", "done", "fds")

    def __init__(self, frame: bytes, fds: Sequence[int], done: asyncio.Future[None]) -> None:
        self.data = memoryview(frame)
        self.fds = list(fds)
        self.done = done


class Launcher:
    """A running ``execgate-launch`` and its control channel."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | int | None,
        channel: Channel,
        sandbox: SandboxSpec | None,
        claim_path: Path | None = None,
        *,
        first_id: int = 1,
    ) -> None:
        """``process``: the launcher we started, or the pid of one someone else started (the
        native front's, :meth:`adopt`: its exit status is theirs; None: it has exited)."""
        self.pid = process.pid if isinstance(process, subprocess.Popen) else process
        self.sandbox = sandbox
        self.claim_path = claim_path
        self._process = process
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(first_id)
        self._pending: dict[int, asyncio.Future[LaunchedProcess]] = {}
        self._running: dict[int, LaunchedProcess] = {}
        # Frames are written in order by one writer; a frame that fits into the socket buffer
        # is written at once (authorize() relies on that: no await between post and answer).
        self._outgoing: collections.deque[_Outgoing] = collections.deque()
        self._writing = False  # a writer callback is registered
        self._written: asyncio.Future[None] = self._loop.create_future()
        self._written.set_result(None)  # what _enqueue returns for a frame written at once
        self._posted: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: The launcher said nothing of the session is left (§7 ``ended``): it exits 0 now.
        self.ended = False
        self._standing = False  # standing authorizations were posted since the last revoke
        self._shutdown_task: asyncio.Task[None] | None = None
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._watch_exit()
        self._reader = self._loop.create_task(self._read_events())

    @classmethod
    async def start(
        cls,
        sandbox: SandboxSpec | None,
        *,
        new_session: bool,
        stderr: int | None = None,
        claim_path: Path | None = None,
        terminal: int | None = None,
        proxy_report: int | None = None,
    ) -> Launcher:
        """Start a launcher whose ``sandboxed`` spawns are confined by ``sandbox``.

        Raises :class:`ExecgateError` (naming what is missing and how to proceed) when the
        kernel cannot enforce ``sandbox``: nothing ever runs unconfined by surprise.
        ``new_session``: the launcher calls setsid (no controlling terminal; e.g. for MCP).
        ``stderr``: where the launcher's own diagnostics go (default: inherited).
        ``claim_path``: where the launcher listens for escalation claims (§4), a socket created
        here, mode 0600, in a folder only we can write to; without it nothing can be claimed.
        ``terminal``: a terminal (a PTY's follower side) the launcher makes its controlling
        terminal (needs ``new_session``); a main spawn with ``pgid=0`` then gets it.
        ``proxy_report``: for a sandbox with ``network_proxy``, the socket over which each
        confined child sends the listener of its network namespace (native/netns.h).
        """
        if terminal is not None and not new_session:
            raise ValueError("a launcher takes a terminal only in a process session of its own")
        if sandbox is not None:
            if sandbox.strict_exec:  # the gate's own wrapper must stay executable
                gate = [native_path(WRAPPER), native_path(INTERPOSER)]
                sandbox = sandbox.with_gate_paths(executables=gate)
            require_support(sandbox)
        path = native_path(LAUNCHER)
        claims = _listen(claim_path) if claim_path is not None else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            args = [str(path), "--control", str(theirs.fileno())]
            passed = [theirs.fileno()]
            if claims is not None:
                args += ["--claim-fd", str(claims.fileno())]
                passed.append(claims.fileno())
            if terminal is not None:
                args += ["--terminal", str(terminal)]
                passed.append(terminal)
            if sandbox is not None:
                args += sandbox.launcher_args()
            if proxy_report is not None:
                args += ["--proxy-report-fd", str(proxy_report)]
                passed.append(proxy_report)
            try:
                process = subprocess.Popen(
                    args,
                    pass_fds=passed,
                    start_new_session=new_session,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,  # closed by the launcher once it is ready
                    stderr=stderr,
                    cwd="/",
                )
            except OSError as exc:
                ours.close()
                if claim_path is not None:
                    claim_path.unlink(missing_ok=True)
                raise LauncherError(f"cannot start {path}: {exc.strerror}") from None
            orphans.own(process.pid)
        finally:
            theirs.close()
            if claims is not None:
                claims.close()  # the launcher's alone: nobody can claim once it is gone
        try:
            assert process.stdout is not None
            said = await _read_to_eof(process.stdout.fileno())
        finally:
            if process.stdout is not None:
                process.stdout.close()
        if said != b"ready\n":
            ours.close()
            status = await asyncio.get_running_loop().run_in_executor(None, process.wait)
            orphans.disown(process.pid)
            raise LauncherError(f"{path} failed to start (status {status})")
        return cls(process, Channel(ours), sandbox, claim_path)

    @classmethod
    def adopt(
        cls, pid: int | None, control: socket.socket, sandbox: SandboxSpec | None, main_id: int
    ) -> tuple[Launcher, asyncio.Future[LaunchedProcess]]:
        """The launcher the native front started (docs/protocol.md §8) with ``control`` its
        control channel, on which the front already sent spawn ``main_id`` (the session's
        command): the launcher, and the future of that process (as :meth:`spawn`'s). ``pid``
        None: it has exited already (what it said is still on the channel, then its EOF)."""
        control.setblocking(False)
        launcher = cls(pid, Channel(control), sandbox, first_id=main_id + 1)
        main: asyncio.Future[LaunchedProcess] = launcher._loop.create_future()
        launcher._pending[main_id] = main
        return launcher, main

    @property
    def running(self) -> bool:
        """False once the launcher has exited or is shutting down."""
        return not self._closed and self._shutdown_task is None

    async def spawn(
        self,
        *,
        path: bytes,
        argv: Sequence[bytes],
        env: Sequence[bytes],
        cwd: bytes,
        fds: Mapping[int, int],
        sandboxed: bool,
        pgid: int = -1,
        main: bool = False,
        last: bool = False,
        program: int | None = None,
        held: bool = False,
    ) -> LaunchedProcess:
        """Start ``path`` with exactly ``fds`` (target number -> our descriptor, which stays
        ours), ``argv``, ``env`` and ``cwd``; confined when ``sandboxed``. ``program``: a
        descriptor of the file to execute (stays ours); ``path`` then only names it in
        messages, and what runs is the file that was judged, whatever ``path`` became since.

        ``pgid``: ``-1`` the launcher's process group, ``0`` a new one, ``N`` join group N
        (a new one if that is not allowed). ``main``: the session's main program; if it has a
        group of its own and the launcher's group owns the terminal, it gets the terminal
        (given back when it exits). ``last``: the session ends with it: once it has exited and
        no process of the session is left, the launcher exits by itself (nothing can be
        spawned after it). ``held``: the program waits in the interposer, before its own code
        runs, for the call :meth:`release` brings (protocol §7 "Held spawns"; ``env`` must set
        ``EXECGATE_HOLD=3``, and ``fds`` may not name 3). Raises :class:`SpawnError` if
        nothing ran.
        """
        if not self.running:
            raise LauncherError("the session launcher is not running")
        if pgid < -1:
            raise ValueError(f"bad process group {pgid}")
        chosen = (
            ("sandbox", sandboxed),
            ("main", main),
            ("last", last),
            ("execfd", program is not None),
            ("held", held),
        )
        flags = [name for name, on in chosen if on]
        targets = list(fds)
        attached = [fds[t] for t in targets] + ([] if program is None else [program])
        spawn_id = next(self._ids)
        frame = encode_spawn(
            spawn_id,
            flags=flags,
            pgid=pgid,
            cwd=cwd,
            path=path,
            fd_targets=targets,
            argv=argv,
            env=env,
        )
        future: asyncio.Future[LaunchedProcess] = self._loop.create_future()
        self._pending[spawn_id] = future
        try:
            await self._send(frame, attached)
        except BaseException:
            self._pending.pop(spawn_id, None)
            raise
        return await future

    async def release(
        self,
        process: LaunchedProcess,
        *,
        argv: Sequence[bytes],
        env: Sequence[bytes],
        cwd: bytes,
        fds: Mapping[int, int],
        last: bool,
    ) -> None:
        """Hand the held ``process`` its call: it enters ``cwd``, gets ``fds`` (target number
        -> our descriptor, which stays ours) and runs with ``argv`` (as many as it was
        spawned with) and ``env``, each written over the strings it was spawned with (which
        must be at least as long). ``last`` as :meth:`spawn`'s. A process that has gone by
        then is reported as it exits, as always."""
        if not self.running:
            raise LauncherError("the session launcher is not running")
        targets = list(fds)
        frame = encode_release(
            process.spawn_id, last=last, cwd=cwd, fd_targets=targets, argv=argv, env=env
        )
        await self._send(frame, [fds[t] for t in targets])

    def authorize(
        self, ticket: str, authorization: Authorization, program: int
    ) -> asyncio.Future[None]:
        """Let ``ticket`` be claimed once as ``authorization`` says (see :func:`authorization`):
        the launcher then executes the descriptor ``program`` (the file that was judged) on
        the claimer's descriptors (§4, §7). ``program`` stays the caller's: a duplicate travels.

        Posted, not awaited: the returned future is already done when the message went out at
        once (the usual case), so an answer sent to the client after this call cannot overtake
        it. Otherwise the caller must await it before handing out the ticket.
        """
        if not self.running:
            raise LauncherError("the session launcher is not running")
        return self._enqueue(authorization.frame(ticket.encode()), [program], borrowed=True)

    def stand(self, frame: bytes, program: int, watch: int, reports: int) -> None:
        """Post a standing authorization (``frame``: ``protocol.encode_standing``) with the
        descriptor of the judged file, the folder watch and the socket its claims are reported
        on (§7 ``standing``); all three stay the caller's."""
        if not self.running:
            raise LauncherError("the session launcher is not running")
        fds = [program, watch, reports]
        self._enqueue(frame, fds, borrowed=True).add_done_callback(_ignore_outcome)
        self._standing = True

    def revoke(self) -> None:
        """Revoke every standing authorization (§7 ``revoke``). Written before this returns
        (behind every frame already queued, waiting for the socket if it must): nothing the
        session decides after this call can meet a standing authorization made before it. A
        launcher that is gone takes them along."""
        if not self._standing or self._closed:
            return
        self._standing = False
        self._enqueue(encode_revoke()).add_done_callback(_ignore_outcome)
        if not self._outgoing:
            return
        sock = self._channel.sock
        sock.setblocking(True)
        try:
            self._write()
        finally:
            sock.setblocking(False)

    async def shutdown(self, grace: float = 0.5) -> None:
        """SIGTERM every process of the session, SIGKILL what is left after ``grace`` seconds,
        reap them all, and wait for the launcher to exit. Idempotent."""
        if self._shutdown_task is None:
            self._shutdown_task = self._loop.create_task(self._shutdown(grace))
        await asyncio.shield(self._shutdown_task)

    async def __aenter__(self) -> Launcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # -- internals ------------------------------------------------------------------------

    async def _send(self, frame: bytes, fds: Sequence[int] = ()) -> None:
        """Send a frame and wait until it is written (``fds`` must stay open until then)."""
        await self._enqueue(frame, fds)

    def _post(self, frame: bytes) -> None:
        """Send without waiting (signals); failures mean the launcher is gone: ignored."""
        if not self._closed:
            self._enqueue(frame).add_done_callback(_ignore_outcome)

    def _enqueue(
        self, frame: bytes, fds: Sequence[int] = (), *, borrowed: bool = False
    ) -> asyncio.Future[None]:
        """Queue a frame behind the others and write what can be written right now.
        ``borrowed``: ``fds`` are only valid during this call; a frame that has to wait
        takes duplicates along (closed once it is written)."""
        if len(fds) > MAX_FDS:
            raise ProtocolError(f"too many fds: {len(fds)}")
        done: asyncio.Future[None]
        if self._closed:
            done = self._loop.create_future()
            done.set_exception(LauncherError("the session launcher is not running"))
            return done
        if not self._outgoing:  # the usual case: straight into the socket
            try:
                sent = self._sendmsg(frame, fds)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                done = self._loop.create_future()
                done.set_exception(LauncherError(f"the session launcher is gone ({exc.strerror})"))
                return done
            if sent == len(frame):
                return self._written
            if sent:
                frame, fds = frame[sent:], ()  # the descriptors went with the first byte
        done = self._loop.create_future()
        if borrowed and fds:
            copies = [os.dup(fd) for fd in fds]
            fds = copies
            done.add_done_callback(lambda _: _close_all(copies))
        self._outgoing.append(_Outgoing(frame, fds, done))
        if len(self._outgoing) == 1:
            self._write()
        return done

    def _sendmsg(self, data: bytes | memoryview, fds: Sequence[int]) -> int:
        if not fds:
            return self._channel.sock.send(data)
        rights = array.array("i", fds)
        return self._channel.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])

    def _write(self) -> None:
        while self._outgoing:
            item = self._outgoing[0]
            try:
                sent = self._sendmsg(item.data, item.fds)
                item.fds = []
            except BlockingIOError:
                if not self._writing:
                    self._loop.add_writer(self._channel.sock.fileno(), self._write)
                    self._writing = True
                return
            except OSError as exc:
                self._fail_outgoing(f"the session launcher is gone ({exc.strerror})")
                return
            item.data = item.data[sent:]
            if not item.data:
                self._outgoing.popleft()
                if not item.done.done():
                    item.done.set_result(None)
        self._stop_writing()

    def _stop_writing(self) -> None:
        if self._writing:
            self._writing = False
            with contextlib.suppress(ValueError, OSError):  # the socket may be closed already
                self._loop.remove_writer(self._channel.sock.fileno())

    def _fail_outgoing(self, reason: str) -> None:
        self._stop_writing()
        while self._outgoing:
            item = self._outgoing.popleft()
            if not item.done.done():
                item.done.set_exception(LauncherError(reason))

    def _watch_exit(self) -> None:
        pid, process = self.pid, self._process
        if pid is None or process is None:
            return  # (adopted, and gone: its end is its channel's EOF, _read_events)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = -1

        def reap() -> None:
            # An adopted launcher is the front's child: its status is the front's to reap and
            # judge (it kills what a lost launcher left, native/front.c).
            status = process.poll() if not isinstance(process, int) else 0
            if status is None:
                return
            if pidfd >= 0:
                self._loop.remove_reader(pidfd)
                os.close(pidfd)
            orphans.disown(pid)
            # Lost, not shut down: kill what it left behind. A launcher that exits 0 (after
            # its `last` program) has reaped its whole tree: nothing was left to us.
            if self._shutdown_task is None and status != 0:
                sweep = self._loop.create_task(orphans.kill_adopted())
                self._posted.add(sweep)
                sweep.add_done_callback(self._posted.discard)
            if not self._exit.done():
                self._exit.set_result(status)

        if pidfd >= 0:
            self._loop.add_reader(pidfd, reap)
        elif not isinstance(process, int):  # no pidfds (Linux < 5.3): poll (an adopted
            # launcher's end is its control channel's EOF, _read_events)
            polled = process

            async def poll() -> None:
                while polled.poll() is None:
                    await asyncio.sleep(0.05)
                reap()

            task = self._loop.create_task(poll())
            self._posted.add(task)
            task.add_done_callback(self._posted.discard)

    async def _read_events(self) -> None:
        reason = "the session launcher exited"
        try:
            while True:
                fields, fds = await self._channel.recv()
                for fd in fds:
                    os.close(fd)
                self._dispatch(parse_launcher_event(fields))
        except ChannelClosed:
            pass
        except ProtocolError as exc:
            reason = f"the session launcher sent a malformed message ({exc})"
        except OSError as exc:
            reason = f"the session launcher's channel failed ({exc.strerror})"
        finally:
            self._closed = True
            if not isinstance(self._process, subprocess.Popen) and not self._exit.done():
                self._exit.set_result(0)  # adopted: its channel closes when it exits
            self._fail_outgoing(reason)
            error = LauncherError(reason)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()
            for process in self._running.values():
                process._lost(LauncherError(f"{reason} before process {process.pid} ended"))
            self._running.clear()

    def _dispatch(self, event: LauncherEvent) -> None:
        if isinstance(event, Ended):
            self.ended = True
        elif isinstance(event, Spawned):
            process = LaunchedProcess(self, event.spawn_id, event.pid)
            self._running[event.spawn_id] = process
            future = self._pending.pop(event.spawn_id, None)
            if future is None or future.done():  # the spawn() was cancelled: nobody wants it
                process.signal(signal.SIGKILL)
            else:
                future.set_result(process)
        elif isinstance(event, SpawnFailed):
            future = self._pending.pop(event.spawn_id, None)
            if future is not None and not future.done():
                future.set_exception(SpawnError(event.errno, event.message))
        else:
            running = self._running.pop(event.spawn_id, None)
            if running is not None:
                running._exited(event.wait_status)

    async def _shutdown(self, grace: float) -> None:
        if not self._closed:
            with contextlib.suppress(LauncherError):
                await self._send(encode_shutdown(max(0, round(grace * 1000))))
        try:
            await asyncio.wait_for(asyncio.shield(self._exit), timeout=grace + _STUCK_AFTER)
        except TimeoutError:  # a launcher that does not end: last resort
            if isinstance(self._process, int):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._process, signal.SIGKILL)  # the front's child: not reused yet
            elif self._process is not None:
                self._process.kill()
            await self._exit
        # What a launcher that was killed under the session left behind (then adopted by
        # this process, if it is a subreaper) dies with the session. A launcher that exited
        # 0 reaped its whole tree (its subreaper's loop ends only when it has no child left):
        # then nothing was left to us, and the sweep (a read of every process's /proc/PID/stat,
        # tens of ms on a busy machine) is skipped.
        if self._exit.result() != 0:
            await orphans.kill_adopted()
        # Its end of the channel closed with it: the reader sees EOF right away.
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=5.0)
        except TimeoutError:
            self._reader.cancel()
        self._closed = True
        self._fail_outgoing("the session launcher has shut down")
        self._channel.close()


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _ignore_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a launcher that is gone is not worth a warning


def _listen(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, connectable by our uid only."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, 0o600)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        path.unlink(missing_ok=True)
        raise LauncherError(f"cannot listen on {path}: {exc.strerror}") from None
    return sock
