"""One ``shell`` tool call: its session, its shell, its output, its timeout.

A :class:`ShellCall` runs in a task of its own in the server's task group, independent of the
MCP request that started it:
under the 2026-07-28 protocol the request returns while an exec waits for approval, and a later
request (the client's retry) picks the call up again. The call ends when the shell exits, when
its :class:`Stopwatch` runs out, or when it is aborted (request cancelled, server closing, an
abandoned approval); in every case its session is closed, which kills every process the call
started, escalated ones included, before the outcome is published — except when the launcher
has reported that nothing of the session is left (protocol §7 ``ended``): then the outcome is
published first and the session's own clean-up (socket, folder) follows.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from execgate.decisionlog import DecisionLog
from execgate.errors import ExecgateError
from execgate.gate.escalation import Asker, Verdict
from execgate.gate.session import (
    EscalationSession,
    SessionCaller,
    SessionConfig,
    SessionDenied,
    SessionReserve,
)
from execgate.handoff import give_way
from execgate.mcp_front.elicitation import InputRequests
from execgate.mcp_front.stopwatch import Stopwatch
from execgate.mcp_front.tool import (
    TIMEOUT_EXIT_CODE,
    OutputCapture,
    ShellArgs,
    ShellOutcome,
    exit_code_of,
)

log = logging.getLogger("execgate.mcp")

#: How long processes get between SIGTERM and SIGKILL when a call is stopped.
STOP_GRACE = 0.2
#: Longest wait for the output pipe to reach EOF once every process of the call is gone.
_DRAIN_LIMIT = 5.0
_READ_SIZE = 1 << 16

_call_ids = itertools.count(1)


@dataclass(frozen=True)
class CallSetup:
    """What a call needs from the server: its session's configuration (one value, passed to
    the reserve as is) and how to start its shell."""

    session: SessionConfig
    shell: str
    reserve: SessionReserve
    decisions: DecisionLog | None = None  # the front end's log (every call's decisions)

    @property
    def base_env(self) -> Mapping[str, str]:
        return self.session.base_env or {}


OutputListener = Callable[[bytes], None]


class ShellCall:
    """Create, then :meth:`start` in a task group; the outcome comes from :meth:`wait` (or
    :attr:`outcome`)."""

    def __init__(self, setup: CallSetup, args: ShellArgs) -> None:
        self.id = next(_call_ids)
        self.setup = setup
        self.args = args
        self.argv = [setup.shell, "-lc" if args.login else "-c", args.command]
        self.stopwatch = Stopwatch(args.timeout_ms / 1000)
        self.capture = OutputCapture()
        self.outcome: ShellOutcome | None = None
        self.error: str | None = None  # the call could not run at all (isError result)
        #: Questions waiting for the client's retry (2026-07-28 flow), when that is the channel.
        self.inputs: InputRequests | None = None
        #: Set whenever there is something new for the request driving the call (a question
        #: to hand to the client, the outcome).
        self.changed = asyncio.Event()
        self._listeners: list[OutputListener] = []
        self._scope = anyio.CancelScope()  # the whole call: abort() cancels it
        self._started = time.monotonic()
        self._running = False
        self._done = anyio.Event()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, tasks: anyio.abc.TaskGroup, asker: Asker) -> None:
        self._running = True
        tasks.start_soon(self._run, asker)

    @property
    def finished(self) -> bool:
        """The outcome is known (nothing the call started runs any more; its session may
        still be cleaning up: :meth:`wait` waits for that too)."""
        return self.outcome is not None or self._done.is_set()

    async def wait(self) -> None:
        await self._done.wait()

    async def abort(self) -> None:
        """Stop the call (its whole process tree) and wait until it is gone."""
        self._scope.cancel()
        if not self._running:
            self._done.set()
        with anyio.CancelScope(shield=True):
            await self._done.wait()

    def notify(self) -> None:
        self.changed.set()

    # -- output ---------------------------------------------------------------------------------

    def listen(self, listener: OutputListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _output(self, data: bytes) -> None:
        self.capture.feed(data)
        for listener in list(self._listeners):
            listener(data)

    # -- the run --------------------------------------------------------------------------------

    async def _run(self, asker: Asker) -> None:
        exit_code = 0
        timed_out = started = False
        session: EscalationSession | None = None
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        reader = PipeReader(read_fd, self._output)
        try:
            with self._scope:
                caller = SessionCaller(
                    asker, self.stopwatch.asking, decisions=self.setup.decisions, call=self.id
                )
                session = await self.setup.reserve.take(self.setup.session, caller)
                env = {**self.setup.base_env, "PWD": self.args.workdir}
                try:
                    process = await session.start(
                        self.argv,
                        cwd=self.args.workdir,
                        env=env,
                        stdio={0: devnull, 1: write_fd, 2: write_fd},
                    )
                except SessionDenied as denied:
                    self._output(denied.message.encode() + b"\n")
                    exit_code = 126
                else:
                    started = True
                    give_way()  # to the launcher and the shell it was told to run
                    # The shell's own decision is written while it runs, not after it ended.
                    session.flush_records()
                    with anyio.CancelScope() as timer:
                        self.stopwatch.attach(timer)
                        status = await process.wait()
                        exit_code = exit_code_of(status)
                    self.stopwatch.attach(None)
                    # Our copy of the write end is closed only now: the end of the shell wakes
                    # us once (its exit report), not a turn earlier for the end of its output.
                    os.close(write_fd)
                    write_fd = -1
                    if timer.cancelled_caught:
                        log.info(
                            "tool call %d timed out after %d ms of running time; stopping it",
                            self.id,
                            self.args.timeout_ms,
                        )
                        exit_code, timed_out = TIMEOUT_EXIT_CODE, True
                        # The output so far: not what the processes say while being killed.
                        reader.freeze()
                    elif session.emptied:
                        # The launcher reaped the whole tree and exits: there is nothing left
                        # to stop, and every writer of the pipe is gone. Answer now.
                        await reader.drain(_DRAIN_LIMIT)
                        session.flush_records()
                        self._publish(exit_code, timed_out, session)
                        session.release()
            if self._scope.cancelled_caught:
                log.info("tool call %d aborted; stopping it", self.id)
                exit_code = 128 + signal.SIGKILL
                if started:
                    reader.freeze()
        except ExecgateError as exc:
            self.error = f"cannot run the command: {exc}"
            log.warning("tool call %d: %s", self.id, self.error)
        except Exception as exc:  # a bug: still close everything and report it
            self.error = f"cannot run the command: internal error: {type(exc).__name__}: {exc}"
            log.exception("tool call %d failed", self.id)
        finally:
            with anyio.CancelScope(shield=True):
                for fd in (devnull, write_fd):
                    if fd >= 0:
                        os.close(fd)
                if self.outcome is not None:
                    # Published: the request's task, woken by `changed`, writes the answer in
                    # this turn of the loop; the session's clean-up comes after it, and after
                    # the client has taken the answer.
                    await anyio.lowlevel.checkpoint()
                    give_way()
                if session is not None:
                    with contextlib.suppress(Exception):
                        await session.aclose(STOP_GRACE)
                await reader.drain(_DRAIN_LIMIT)
            if self.outcome is None:
                self._publish(exit_code, timed_out, session)
            self._done.set()

    def _publish(self, exit_code: int, timed_out: bool, session: EscalationSession | None) -> None:
        """The outcome, for the request driving the call (its output is complete)."""
        self.outcome = ShellOutcome(
            exit_code=exit_code,
            output=self.capture.text(),
            duration=time.monotonic() - self._started,
            timed_out=timed_out,
            truncated_bytes=self.capture.truncated_bytes,
        )
        log.info(
            "tool call %d ended: exit %d%s, %d bytes of output, %.3f s%s",
            self.id,
            exit_code,
            " (timed out)" if timed_out else "",
            self.capture.total,
            self.outcome.duration,
            _decision_counts(session),
        )
        self.changed.set()


def _decision_counts(session: EscalationSession | None) -> str:
    """``", 3 escalated, 1 denied"``: what a call's execs came to (per-exec lines are DEBUG)."""
    if session is None:
        return ""
    counts = session.verdicts
    shown = [(counts[Verdict.ESCALATE], "escalated"), (counts[Verdict.DENY], "denied")]
    return "".join(f", {n} {what}" for n, what in shown if n)


class PipeReader:
    """Reads a pipe on the event loop, handing every chunk to ``sink``, until EOF."""

    def __init__(self, fd: int, sink: Callable[[bytes], None]) -> None:
        self._fd = fd
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._eof = asyncio.Event()
        self._frozen = False
        self._closed = False
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> bool:
        """Read one chunk; False when there is nothing more to read right now."""
        try:
            data = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            if not self._frozen:
                self._sink(data)
            return True
        self._loop.remove_reader(self._fd)
        self._eof.set()
        return False

    def _read_now(self) -> None:
        """Read what is there now (and EOF, if every writer is gone), without waiting."""
        for _ in range(64):  # bounded: a writer that never pauses must not hold us here
            if self._eof.is_set() or not self._readable():
                break

    def freeze(self) -> None:
        """Take in everything written so far; whatever comes later is read and dropped."""
        self._read_now()
        self._frozen = True

    async def drain(self, limit: float) -> None:
        """Wait for EOF (every writer gone), at most ``limit`` seconds; then close the pipe.
        Once closed, a no-op."""
        if self._closed:
            return
        self._read_now()  # usually reaches EOF: the writers are gone before we drain
        if not self._eof.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._eof.wait(), limit)
        if not self._eof.is_set():
            log.warning("output pipe still open after the call ended; closing it")
            self._loop.remove_reader(self._fd)
        if not self._closed:  # (drain may be called again while this one waited)
            self._closed = True
            os.close(self._fd)


class ProgressPump:
    """Streams a call's output to the client as ``notifications/progress`` (progress = bytes so
    far, message = the new text), coalescing chunks so a chatty command sends a few
    notifications per second, not thousands."""

    INTERVAL = 0.05
    #: Text streamed per call at most (the result has the output anyway).
    LIMIT = 1 << 20

    def __init__(self, send: Callable[[float, str | None], Awaitable[None]]) -> None:
        self._send = send
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending: list[str] = []
        self._pending_size = 0
        self._total = 0
        self._sent_text = 0
        self._sent_total = 0
        self._ready = asyncio.Event()
        self._scope = anyio.CancelScope()

    def feed(self, data: bytes) -> None:
        self._total += len(data)
        if self._sent_text + self._pending_size < self.LIMIT:
            self._pending.append(self._decoder.decode(data))
            self._pending_size += len(data)
        self._ready.set()

    @contextlib.asynccontextmanager
    async def streaming(self) -> AsyncIterator[ProgressPump]:
        """Send notifications while in the block (:meth:`finish` sends the last one)."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._run)
            try:
                yield self
            finally:
                self._scope.cancel()

    async def _run(self) -> None:
        with self._scope:
            while True:
                await self._ready.wait()
                await self._flush()
                await anyio.sleep(self.INTERVAL)  # rate limit, not synchronisation

    async def _flush(self) -> None:
        self._ready.clear()
        if self._total == self._sent_total:
            return
        text: str | None = "".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        self._sent_total = self._total
        if text:
            text = text[: max(0, self.LIMIT - self._sent_text)]
            self._sent_text += len(text)
        with contextlib.suppress(Exception):
            await self._send(float(self._total), text or None)

    async def finish(self) -> None:
        """Stop streaming and send what is left."""
        self._scope.cancel()
        await self._flush()
