"""One ``shell`` tool call: its session, its shell, its output, its timeout.

A :class:`ShellCall` runs in a task of its own, independent of the MCP request that started it:
under the 2026-07-28 protocol the request returns while an exec waits for approval, and a later
request (the client's retry) picks the call up again. The call ends when the shell exits, when
its :class:`Stopwatch` runs out, or when it is aborted (request cancelled, server closing, an
abandoned approval); in every case its session is closed, which kills every process the call
started, escalated ones included, before the outcome is published.
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from execgate.decisionlog import DecisionLog
from execgate.errors import ExecgateError
from execgate.gate.escalation import Asker, EscalationPolicy
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.network import NetworkSettings
from execgate.gate.session import EscalationSession, SessionDenied, SessionReserve
from execgate.mcp_front.elicitation import InputRequests
from execgate.mcp_front.tool import (
    TIMEOUT_EXIT_CODE,
    OutputCapture,
    ShellArgs,
    ShellOutcome,
)
from execgate.sandbox import SandboxSpec

log = logging.getLogger("execgate.mcp")

#: How long processes get between SIGTERM and SIGKILL when a call is stopped.
STOP_GRACE = 0.2
#: Longest wait for the output pipe to reach EOF once every process of the call is gone.
_DRAIN_LIMIT = 5.0
_READ_SIZE = 1 << 16

_call_ids = itertools.count(1)


class Stopwatch:
    """A countdown that stands still while a human is being asked.

    Pauses are reference counted: overlapping questions pause it once, and it runs again when
    the last one is answered (resuming at count 0 does nothing). Time spent paused never counts,
    before or after.
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._banked = 0.0
        self._since: float | None = time.monotonic()
        self._pauses = 0
        self._changed = asyncio.Event()

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    def elapsed(self) -> float:
        running = time.monotonic() - self._since if self._since is not None else 0.0
        return self._banked + running

    def pause(self) -> None:
        if self._pauses == 0 and self._since is not None:
            self._banked += time.monotonic() - self._since
            self._since = None
        self._pauses += 1
        self._changed.set()

    def resume(self) -> None:
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses == 0:
            self._since = time.monotonic()
            self._changed.set()

    async def expired(self) -> None:
        """Return once the running time reaches the limit."""
        while True:
            self._changed.clear()
            if self._pauses:
                await self._changed.wait()
                continue
            remaining = self.limit - self.elapsed()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)


@dataclass(frozen=True)
class CallSetup:
    """What a call needs from the server to open its session."""

    live: LivePolicy
    escalation: EscalationPolicy
    sandbox: SandboxSpec | None
    shell: str
    base_env: Mapping[str, str]
    gate_escalated: bool
    approval_timeout: float  # the session's own backstop; questions time out in the registry
    decisions: DecisionLog | None = None
    clean_escalated_env: tuple[str, ...] = ()
    reserve: SessionReserve = field(default_factory=SessionReserve)
    network: NetworkSettings | None = None


OutputListener = Callable[[bytes], None]


class ShellCall:
    """Create, then :meth:`start`; the outcome comes from :meth:`wait` (or :attr:`outcome`)."""

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
        self._abort = asyncio.Event()
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, asker: Asker) -> None:
        self._task = asyncio.ensure_future(self._run(asker))

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> None:
        await self._done.wait()

    async def abort(self) -> None:
        """Stop the call (its whole process tree) and wait until it is gone."""
        self._abort.set()
        if self._task is None:
            self._done.set()
            return
        await asyncio.shield(self._task)

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

    def _on_ask(self, asking: bool) -> None:
        if asking:
            self.stopwatch.pause()
        else:
            self.stopwatch.resume()

    async def _run(self, asker: Asker) -> None:
        exit_code = 0
        timed_out = False
        session: EscalationSession | None = None
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        reader = _PipeReader(read_fd, self._output)
        try:
            session = await self.setup.reserve.take(
                live=self.setup.live,
                escalation=self.setup.escalation,
                sandbox=self.setup.sandbox,
                base_env=self.setup.base_env,
                gate_escalated=self.setup.gate_escalated,
                clean_escalated_env=self.setup.clean_escalated_env,
                approval_timeout=self.setup.approval_timeout,
                new_process_session=True,
                network=self.setup.network,
            )
            session.asker, session.on_ask = asker, self._on_ask
            session.decisions, session.call = self.setup.decisions, self.id
            env = {**self.setup.base_env, "PWD": self.args.workdir}
            starting = asyncio.ensure_future(
                session.start(
                    self.argv,
                    cwd=self.args.workdir,
                    env=env,
                    stdio={0: devnull, 1: write_fd, 2: write_fd},
                )
            )
            aborting = asyncio.ensure_future(self._abort.wait())
            try:
                await asyncio.wait({starting, aborting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                aborting.cancel()
            if not starting.done():  # aborted while the shell itself waited for approval
                starting.cancel()
                exit_code = 128 + signal.SIGKILL
                with contextlib.suppress(asyncio.CancelledError, ExecgateError):
                    await starting
            else:
                try:
                    process = starting.result()
                except SessionDenied as denied:
                    self._output(denied.message.encode() + b"\n")
                    exit_code = 126
                else:
                    os.close(write_fd)
                    write_fd = -1
                    exit_code, timed_out, stopped = await self._supervise(process.wait())
                    if stopped:
                        # The output so far: not what the processes say while being killed.
                        reader.freeze()
        except ExecgateError as exc:
            self.error = f"cannot run the command: {exc}"
            log.warning("tool call %d: %s", self.id, self.error)
        except Exception as exc:  # a bug: still close everything and report it
            self.error = f"cannot run the command: internal error: {type(exc).__name__}: {exc}"
            log.exception("tool call %d failed", self.id)
        finally:
            for fd in (devnull, write_fd):
                if fd >= 0:
                    os.close(fd)
            if session is not None:
                with contextlib.suppress(Exception):
                    await session.aclose(STOP_GRACE)
            await reader.drain(_DRAIN_LIMIT)
            self.outcome = ShellOutcome(
                exit_code=exit_code,
                output=self.capture.text(),
                duration=time.monotonic() - self._started,
                timed_out=timed_out,
                truncated_bytes=self.capture.truncated_bytes,
            )
            log.info(
                "tool call %d ended: exit %d%s, %d bytes of output, %.3f s",
                self.id,
                exit_code,
                " (timed out)" if timed_out else "",
                self.capture.total,
                self.outcome.duration,
            )
            self._done.set()
            self.changed.set()

    async def _supervise(self, waiting: Awaitable[int]) -> tuple[int, bool, bool]:
        """Wait for the shell, its timeout, or an abort; return (exit code, timed out, stopped
        by us)."""
        exited = asyncio.ensure_future(waiting)
        expiry = asyncio.ensure_future(self.stopwatch.expired())
        aborting = asyncio.ensure_future(self._abort.wait())
        try:
            await asyncio.wait({exited, expiry, aborting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (expiry, aborting):
                task.cancel()
        if exited.done():
            status = exited.result()
            code = os.waitstatus_to_exitcode(status)
            return (128 - code if code < 0 else code), False, False
        exited.cancel()
        if expiry.done():
            log.info(
                "tool call %d timed out after %d ms of running time; stopping it",
                self.id,
                self.args.timeout_ms,
            )
            return TIMEOUT_EXIT_CODE, True, True
        log.info("tool call %d aborted; stopping it", self.id)
        return 128 + signal.SIGKILL, False, True


class _PipeReader:
    """Reads a pipe on the event loop, handing every chunk to ``sink``, until EOF."""

    def __init__(self, fd: int, sink: Callable[[bytes], None]) -> None:
        self._fd = fd
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._eof = asyncio.Event()
        self._frozen = False
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

    def freeze(self) -> None:
        """Take in everything written so far; whatever comes later is read and dropped."""
        for _ in range(64):  # bounded: a writer that never pauses must not hold us here
            if self._eof.is_set() or not self._readable():
                break
        self._frozen = True

    async def drain(self, limit: float) -> None:
        """Wait for EOF (every writer gone), at most ``limit`` seconds; then close the pipe."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._eof.wait(), limit)
        if not self._eof.is_set():
            log.warning("output pipe still open after the call ended; closing it")
            self._loop.remove_reader(self._fd)
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
        self._task: asyncio.Task[None] | None = None

    def feed(self, data: bytes) -> None:
        self._total += len(data)
        if self._sent_text + self._pending_size < self.LIMIT:
            self._pending.append(self._decoder.decode(data))
            self._pending_size += len(data)
        self._ready.set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        while True:
            await self._ready.wait()
            await self._flush()
            await asyncio.sleep(self.INTERVAL)  # rate limit, not synchronisation

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

    async def stop(self, *, flush: bool) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if flush:
            await self._flush()
