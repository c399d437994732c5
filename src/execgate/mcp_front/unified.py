"""Unified exec: long-lived processes started by ``exec_command`` and fed by ``write_stdin``.

Each :class:`UnifiedProcess` has an escalation session of its own, opened for it and closed
with it: closing denies its pending questions, kills everything it started (escalated programs
included) and removes its socket, so nothing of it outlives the process. It runs in a task of
the server's task group; the :class:`ProcessStore` keeps at most :data:`MAX_PROCESSES` of them
and ends them all when the client goes away or the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import itertools
import logging
import math
import os
import signal
import struct
import termios
import time
from typing import Any, Final

import anyio
import anyio.abc

from execgate.errors import ExecgateError
from execgate.gate.escalation import Asker
from execgate.gate.session import (
    EscalationSession,
    SessionCaller,
    SessionDenied,
)
from execgate.mcp_front.calls import STOP_GRACE, CallSetup, PipeReader
from execgate.mcp_front.stopwatch import Stopwatch
from execgate.mcp_front.tool import OUTPUT_CAP, OutputCapture, exit_code_of
from execgate.mcp_front.unified_tool import BYTES_PER_TOKEN, ExecArgs, ExecOutput, limit_tokens

log = logging.getLogger("execgate.mcp")

MAX_PROCESSES: Final = 64
#: The most recently used processes are never evicted to make room.
PROTECTED: Final = 8
#: Output is buffered per process up to this (head and tail kept, a marker between).
OUTPUT_LIMIT: Final = OUTPUT_CAP
_DRAIN_LIMIT = 2.0
#: After a write, the result comes once the answer has arrived and the process has said nothing
#: more for this long (or at the end of the window): an echo or a prompt need not wait 250 ms+.
SETTLE: Final = 0.02
#: What children see besides the server's environment: no colours, no pagers (the reference's).
CHILD_ENV: Final = {
    "NO_COLOR": "1",
    "TERM": "dumb",
    "LANG": "C.UTF-8",
    "LC_CTYPE": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "COLORTERM": "",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GH_PAGER": "cat",
}
#: On a PTY programs may use the terminal's abilities.
TTY_TERM: Final = "xterm-256color"
_TTY_SIZE = (24, 200)  # rows, columns

_ids = itertools.count(1000)


class UnifiedError(Exception):
    """A request the store cannot serve (unknown session, no room); shown to the model."""


class UnifiedProcess:
    """Create, :meth:`start` in a task group, then :meth:`interact`; :meth:`terminate` ends it."""

    def __init__(self, setup: CallSetup, args: ExecArgs) -> None:
        self.id = next(_ids)
        self.setup = setup
        self.args = args
        self.pending = OutputCapture(OUTPUT_LIMIT)  # written, not yet returned
        self.stopwatch = Stopwatch(0.0)  # the current yield window; stands still while asking
        self.exit_code: int | None = None
        self.error: str | None = None
        self.last_used = time.monotonic()
        self.busy = 0  # interactions in progress: never evicted meanwhile
        self._scope = anyio.CancelScope()  # the whole process: terminate() cancels it
        self._ended = anyio.Event()  # the process and its session are gone, output read
        self._input = -1  # the PTY's leader side or the stdin pipe
        self._running = False
        self._writing = anyio.Lock()
        self._activity = asyncio.Event()  # output arrived, or the process ended
        self._last_output = 0.0
        #: The front end's: the request that last interacted with the process (where its
        #: questions go).
        self.context: Any = None

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def exited(self) -> bool:
        return self._ended.is_set()

    def start(self, tasks: anyio.abc.TaskGroup, asker: Asker) -> None:
        self._running = True
        tasks.start_soon(self._run, asker)

    async def terminate(self) -> None:
        """Kill the whole tree (escalated programs included) and wait until it is gone."""
        self._scope.cancel()
        if not self._running:
            self._ended.set()
        with anyio.CancelScope(shield=True):
            await self._ended.wait()

    def _output(self, data: bytes) -> None:
        self.pending.feed(data)
        self._last_output = time.monotonic()
        self._activity.set()

    async def _run(self, asker: Asker) -> None:
        args = self.args
        caller = SessionCaller(
            asker, self.stopwatch.asking, decisions=self.setup.decisions, call=self.id
        )
        session: EscalationSession | None = None
        child_fds: list[int] = []
        reader: PipeReader | None = None
        exit_code = -1
        try:
            if args.tty:
                leader, follower = os.openpty()
                os.set_inheritable(leader, False)
                fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", *_TTY_SIZE, 0, 0))
                self._input, child_fds = leader, [follower]
                stdio = {0: follower, 1: follower, 2: follower}
                reader = PipeReader(os.dup(leader), self._output)
            else:
                stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
                os.set_blocking(stdin_write, False)
                out_read, out_write = os.pipe2(os.O_CLOEXEC)
                self._input, child_fds = stdin_write, [stdin_read, out_write]
                stdio = {0: stdin_read, 1: out_write, 2: out_write}
                reader = PipeReader(out_read, self._output)
            with self._scope:
                if args.tty:  # a launcher of its own, which takes the PTY as its terminal
                    config = dataclasses.replace(self.setup.session, terminal=child_fds[0])
                    session = await EscalationSession.open(config, caller)
                else:
                    session = await self.setup.reserve.take(self.setup.session, caller)
                env = {
                    **self.setup.base_env,
                    **CHILD_ENV,
                    **({"TERM": TTY_TERM} if args.tty else {}),
                    "PWD": args.workdir,
                }
                try:
                    process = await session.start(
                        args.argv,
                        cwd=args.workdir,
                        env=env,
                        stdio=stdio,
                        pgid=0 if args.tty else -1,
                    )
                except SessionDenied as denied:
                    self._output(denied.message.encode() + b"\n")
                    exit_code = 126
                else:
                    _close_all(child_fds)
                    child_fds = []
                    status = await process.wait()
                    exit_code = exit_code_of(status)
            if self._scope.cancelled_caught:
                exit_code = 128 + signal.SIGKILL
        except ExecgateError as exc:
            self.error = f"cannot run the command: {exc}"
            log.warning("unified exec %d: %s", self.id, self.error)
        except Exception as exc:  # a bug: still close everything and report it
            self.error = f"cannot run the command: internal error: {type(exc).__name__}: {exc}"
            log.exception("unified exec %d failed", self.id)
        finally:
            with anyio.CancelScope(shield=True):
                _close_all(child_fds)
                if session is not None:
                    with contextlib.suppress(Exception):
                        await session.aclose(STOP_GRACE)
                if reader is not None:
                    await reader.drain(_DRAIN_LIMIT)
                if self._input >= 0:
                    os.close(self._input)
                    self._input = -1
            self.exit_code = exit_code
            log.info("unified exec %d ended: exit %d", self.id, exit_code)
            self._ended.set()
            self._activity.set()

    # -- interaction ----------------------------------------------------------------------------

    async def interact(self, chars: str, yield_ms: int, max_tokens: int) -> ExecOutput:
        """Write ``chars`` (if any), then collect output until the process ends or
        ``yield_ms`` of running time pass (time spent asking a human does not count)."""
        started = time.monotonic()
        self.busy += 1
        try:
            if chars and not self.exited:
                await self._write(chars.encode("utf-8", "surrogatepass"))
            self.stopwatch.restart(yield_ms / 1000)
            with anyio.CancelScope() as window:
                self.stopwatch.attach(window)
                await self._wait(settle=bool(chars))
            self.stopwatch.attach(None)
            text = self.pending.text()
            self.pending = OutputCapture(OUTPUT_LIMIT)
        finally:
            self.busy -= 1
            self.last_used = time.monotonic()
        original = (len(text.encode("utf-8", "replace")) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN
        if self.error is not None:
            text = f"{text}execgate: {self.error}\n"
        output, cut = limit_tokens(text, max_tokens)
        return ExecOutput(
            output=output,
            wall_time=time.monotonic() - started,
            exit_code=self.exit_code if self.exited else None,
            session_id=None if self.exited else self.id,
            original_tokens=original,
            truncated_bytes=cut,
        )

    async def _wait(self, *, settle: bool) -> None:
        """Until the process ends; with ``settle``, also until output came and then paused."""
        before = self.pending.total
        while not self.exited:
            self._activity.clear()
            answered = settle and self.pending.total > before
            if answered and time.monotonic() - self._last_output >= SETTLE:
                return
            with anyio.move_on_after(SETTLE if answered else math.inf):
                await self._activity.wait()

    async def _write(self, data: bytes) -> None:
        async with self._writing:
            loop = asyncio.get_running_loop()
            view = memoryview(data)
            while view and self._input >= 0 and not self.exited:
                try:
                    written = os.write(self._input, view)
                except BlockingIOError:
                    await _writable(loop, self._input)
                    continue
                except OSError:  # the reading side is gone: the process ends soon
                    return
                view = view[written:]


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready = loop.create_future()
    loop.add_writer(fd, ready.set_result, None)
    try:
        with anyio.move_on_after(0.5):  # bounded: the process may end meanwhile
            await ready
    finally:
        loop.remove_writer(fd)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class ProcessStore:
    """The live processes of one connection, by session id, at most :data:`MAX_PROCESSES`."""

    def __init__(self, limit: int = MAX_PROCESSES, protected: int = PROTECTED) -> None:
        self.limit = limit
        self.protected = protected
        self._processes: dict[int, UnifiedProcess] = {}

    def __len__(self) -> int:
        return len(self._processes)

    def get(self, session_id: int) -> UnifiedProcess:
        process = self._processes.get(session_id)
        if process is None:
            raise UnifiedError(
                f"no unified exec session {session_id} (it exited and its exit was reported, "
                "or it was ended to make room for newer ones)"
            )
        return process

    def victim(self) -> UnifiedProcess | None:
        """Whom to end to make room: not one of the most recently used, not one being
        written to; the least recently used exited one, else the least recently used."""
        by_use = sorted(self._processes.values(), key=lambda p: p.last_used)
        candidates = [p for p in by_use[: max(0, len(by_use) - self.protected)] if not p.busy]
        exited = [p for p in candidates if p.exited]
        choice = exited or candidates
        return choice[0] if choice else None

    async def make_room(self) -> None:
        while len(self._processes) >= self.limit:
            victim = self.victim()
            if victim is None:
                raise UnifiedError(
                    f"too many unified exec sessions ({len(self._processes)}), all in use; "
                    "end some with write_stdin (e.g. send Ctrl-C, \\u0003) first"
                )
            log.info("unified exec %d: ended to make room", victim.id)
            self._processes.pop(victim.id, None)
            await victim.terminate()

    def add(self, process: UnifiedProcess) -> None:
        self._processes[process.id] = process

    def forget(self, process: UnifiedProcess) -> None:
        self._processes.pop(process.id, None)

    async def aclose(self) -> None:
        processes = list(self._processes.values())
        self._processes.clear()
        if processes:
            log.info("ending %d unified exec session(s)", len(processes))
        async with anyio.create_task_group() as ending:
            for process in processes:
                ending.start_soon(process.terminate)
