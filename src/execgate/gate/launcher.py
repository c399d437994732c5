"""The Python side of the ``execgate-launch`` control channel (docs/protocol.md §7).

One launcher per session: a subreaper that spawns every program of the session (the sandboxed
main program and each escalated one), reports their exits, and kills the whole tree when the
session ends. ::

    launcher = await Launcher.start(spec, new_session=True)
    try:
        proc = await launcher.spawn(path=b"/bin/bash", argv=[b"bash", b"-c", b"make"],
                                    env=env, cwd=b"/src", fds={0: 0, 1: w, 2: w},
                                    sandboxed=True, main=True)
        status = await proc.wait()          # raw wait(2) status
    finally:
        await launcher.shutdown()           # nothing of the session survives this
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from types import TracebackType

from execgate.errors import ExecgateError
from execgate.gate.channel import Channel, ChannelClosed
from execgate.gate.protocol import (
    Exited,
    ProtocolError,
    Spawned,
    SpawnFailed,
    encode_launcher_signal,
    encode_shutdown,
    encode_spawn,
    parse_launcher_event,
)
from execgate.native import INTERPOSER, LAUNCHER, WRAPPER, native_path
from execgate.sandbox.probe import require_support
from execgate.sandbox.spec import SandboxSpec

# How long shutdown() waits beyond the grace period before SIGKILLing a stuck launcher.
_STUCK_AFTER = 15.0


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


class Launcher:
    """A running ``execgate-launch`` and its control channel."""

    def __init__(
        self, process: subprocess.Popen[bytes], channel: Channel, sandbox: SandboxSpec | None
    ) -> None:
        self.pid = process.pid
        self.sandbox = sandbox
        self._process = process
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[LaunchedProcess]] = {}
        self._running: dict[int, LaunchedProcess] = {}
        self._send_lock = asyncio.Lock()
        self._posted: set[asyncio.Task[None]] = set()
        self._closed = False
        self._shutdown_task: asyncio.Task[None] | None = None
        self._exit: asyncio.Future[int] = self._loop.create_future()
        self._watch_exit()
        self._reader = self._loop.create_task(self._read_events())

    @classmethod
    async def start(
        cls, sandbox: SandboxSpec | None, *, new_session: bool, stderr: int | None = None
    ) -> Launcher:
        """Start a launcher whose ``sandboxed`` spawns are confined by ``sandbox``.

        Raises :class:`ExecgateError` (naming what is missing and how to proceed) when the
        kernel cannot enforce ``sandbox``: nothing ever runs unconfined by surprise.
        ``new_session``: the launcher calls setsid (no controlling terminal; e.g. for MCP).
        ``stderr``: where the launcher's own diagnostics go (default: inherited).
        """
        if sandbox is not None:
            if sandbox.strict_exec:  # the gate's own wrapper must stay executable
                gate = [native_path(WRAPPER), native_path(INTERPOSER)]
                sandbox = sandbox.with_gate_paths(executables=gate)
            require_support(sandbox)
        path = native_path(LAUNCHER)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            args = [str(path), "--control", str(theirs.fileno())]
            if sandbox is not None:
                args += sandbox.launcher_args()
            try:
                process = subprocess.Popen(
                    args,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=new_session,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,  # closed by the launcher once it is ready
                    stderr=stderr,
                    cwd="/",
                )
            except OSError as exc:
                ours.close()
                raise LauncherError(f"cannot start {path}: {exc.strerror}") from None
        finally:
            theirs.close()
        try:
            assert process.stdout is not None
            said = await _read_to_eof(process.stdout.fileno())
        finally:
            if process.stdout is not None:
                process.stdout.close()
        if said != b"ready\n":
            ours.close()
            status = await asyncio.get_running_loop().run_in_executor(None, process.wait)
            raise LauncherError(f"{path} failed to start (status {status})")
        return cls(process, Channel(ours), sandbox)

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
    ) -> LaunchedProcess:
        """Start ``path`` with exactly ``fds`` (target number -> our descriptor, which stays
        ours), ``argv``, ``env`` and ``cwd``; confined when ``sandboxed``.

        ``pgid``: ``-1`` the launcher's process group, ``0`` a new one, ``N`` join group N
        (a new one if that is not allowed). ``main``: the session's main program; if it has a
        group of its own and the launcher's group owns the terminal, it gets the terminal
        (given back when it exits). Raises :class:`SpawnError` if nothing ran.
        """
        if not self.running:
            raise LauncherError("the session launcher is not running")
        if pgid < -1:
            raise ValueError(f"bad process group {pgid}")
        flags = [name for name, on in (("sandbox", sandboxed), ("main", main)) if on]
        targets = list(fds)
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
            await self._send(frame, [fds[t] for t in targets])
        except BaseException:
            self._pending.pop(spawn_id, None)
            raise
        return await future

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
        if self._closed:
            raise LauncherError("the session launcher is not running")
        async with self._send_lock:
            try:
                await self._channel.send(frame, fds)
            except OSError as exc:
                raise LauncherError(f"the session launcher is gone ({exc.strerror})") from None

    def _post(self, frame: bytes) -> None:
        """Send without waiting (signals); failures mean the launcher is gone: ignored."""

        async def send() -> None:
            with contextlib.suppress(LauncherError):
                await self._send(frame)

        if self._closed:
            return
        task = self._loop.create_task(send())
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)

    def _watch_exit(self) -> None:
        try:
            pidfd = os.pidfd_open(self._process.pid)
        except OSError:
            pidfd = -1

        def reap() -> None:
            status = self._process.poll()
            if status is None:
                return
            if pidfd >= 0:
                self._loop.remove_reader(pidfd)
                os.close(pidfd)
            if not self._exit.done():
                self._exit.set_result(status)

        if pidfd >= 0:
            self._loop.add_reader(pidfd, reap)
        else:  # no pidfds (Linux < 5.3): poll

            async def poll() -> None:
                while self._process.poll() is None:
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
            error = LauncherError(reason)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()
            for process in self._running.values():
                process._lost(LauncherError(f"{reason} before process {process.pid} ended"))
            self._running.clear()

    def _dispatch(self, event: Spawned | SpawnFailed | Exited) -> None:
        if isinstance(event, Spawned):
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
            self._process.kill()
            await self._exit
        # Its end of the channel closed with it: the reader sees EOF right away.
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=5.0)
        except TimeoutError:
            self._reader.cancel()
        self._closed = True
        self._channel.close()
