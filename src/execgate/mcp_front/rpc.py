"""One JSON-RPC connection over the MCP client's stdio, on the event loop.

:class:`Connection` reads the client's lines, answers each request from a task of its own (so
calls run concurrently), routes the answers to our requests (``elicitation/create``) back to
their callers, and applies ``notifications/cancelled``: the request's task is cancelled and
never answered. When the client goes away (end of input, or a write that finds the pipe
closed), every request still running is cancelled and answered ``-32000 Connection closed``
(if the client can still read), and our own requests fail the same way.

What a request means is the :class:`Handler`'s business (:mod:`execgate.mcp_front.server`):
:meth:`Handler.accept` runs in the read loop, in the order the client sent things, so the
protocol era, the handshake and errors about the request itself are settled before the next
line is read; the work it returns runs in the connection's task group.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
import anyio.abc

from execgate.mcp_front.wire import (
    CONNECTION_CLOSED,
    INTERNAL_ERROR,
    Malformed,
    Notification,
    Request,
    RequestId,
    Response,
    RpcError,
    encode,
    error_message,
    read_message,
    result_message,
)
from execgate.readable import ReadableWatch
from execgate.visible import visible

log = logging.getLogger("execgate.mcp")

#: What a request turns into: its answer now, or work whose result is the answer.
Work = Callable[[], Awaitable[dict[str, Any]]]
_READ_SIZE = 1 << 16
#: The most a last answer may wait for a client that does not read (at shutdown).
_LAST_WRITE_LIMIT = 2.0


class ClientGone(ConnectionError):
    """The client closed its end: nothing more can be sent."""


class Handler(Protocol):
    def accept(self, request: Request) -> dict[str, Any] | Work:
        """The answer to ``request`` (a result now, or work that returns it); raises
        :class:`RpcError` for an error answer."""
        ...

    def notified(self, notification: Notification) -> None:
        """A notification from the client (``notifications/cancelled`` is handled here)."""
        ...


class _InFlight:
    __slots__ = ("by_client", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.by_client = False  # cancelled by the client: no answer at all


class Connection:
    """JSON-RPC on ``read_fd``/``write_fd``; ``buffered``: what was read before we started."""

    _input: ReadableWatch  # the client's lines, watched while :meth:`run` runs

    def __init__(self, read_fd: int, write_fd: int, buffered: bytes = b"") -> None:
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._buffer = bytearray(buffered)
        self._ids = itertools.count(1)
        self._pending: dict[RequestId, asyncio.Future[Response]] = {}
        self._in_flight: dict[RequestId, _InFlight] = {}
        self._write_lock = anyio.Lock()
        self._reading = anyio.CancelScope()
        self.closed = False

    # -- serving --------------------------------------------------------------------------

    async def run(self, handler: Handler) -> None:
        """Serve until the client goes away; every request it sent is settled on return."""
        flags = [(fd, fcntl.fcntl(fd, fcntl.F_GETFL)) for fd in (self._read_fd, self._write_fd)]
        for fd, _ in flags:
            os.set_blocking(fd, False)
        self._input = ReadableWatch(self._read_fd)
        try:
            async with anyio.create_task_group() as requests:
                with self._reading:
                    await self._read(handler, requests)
                self._close()
                for request in self._in_flight.values():
                    request.scope.cancel()
        finally:
            self._close()
            self._input.close()
            for fd, flag in flags:  # a terminal's flags belong to the shell it came from
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETFL, flag)

    async def _read(self, handler: Handler, requests: anyio.abc.TaskGroup) -> None:
        searched = 0
        eof = False
        while True:
            end = self._buffer.find(b"\n", searched)
            if end < 0 and eof:
                end = len(self._buffer)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                searched = 0
                if line.strip():
                    await self._received(line, handler, requests)
                elif eof:
                    return
                continue
            searched = len(self._buffer)
            try:
                chunk = os.read(self._read_fd, _READ_SIZE)
            except BlockingIOError:
                await self._input.wait()
                continue
            except OSError:
                chunk = b""
            if chunk:
                self._buffer += chunk
            else:
                eof = True

    async def _received(self, line: bytes, handler: Handler, requests: anyio.abc.TaskGroup) -> None:
        message = read_message(line)
        if isinstance(message, Request):
            try:
                outcome = handler.accept(message)
            except RpcError as exc:
                await self._answer(error_message(message.id, exc.code, exc.message, exc.data))
                return
            except Exception:  # a bug: this request fails, the connection goes on
                log.exception("internal error while reading request %r", message.id)
                await self._answer(error_message(message.id, INTERNAL_ERROR, "Internal error"))
                return
            if isinstance(outcome, dict):
                await self._answer(result_message(message.id, outcome))
                return
            in_flight = _InFlight()
            self._in_flight[message.id] = in_flight
            requests.start_soon(self._serve, message.id, outcome, in_flight)
        elif isinstance(message, Notification):
            if message.method == "notifications/cancelled":
                self._cancelled((message.params or {}).get("requestId"))
            handler.notified(message)
        elif isinstance(message, Response):
            future = self._pending.get(message.id)
            if future is not None and not future.done():
                future.set_result(message)
            else:
                log.debug("an answer to no request of ours: %r", message.id)
        else:
            self._malformed(message)
            if message.answer is not None:
                await self._answer(message.answer)

    def _malformed(self, message: Malformed) -> None:
        answered = f" (answered {message.answer['error']['code']})" if message.answer else ""
        log.warning("malformed message from the client%s: %s", answered, visible(message.why))

    def _cancelled(self, request_id: object) -> None:
        for key, request in self._in_flight.items():
            # A client may name the id as a string of the number it sent, or the reverse.
            if key == request_id or str(key) == str(request_id):
                request.by_client = True
                request.scope.cancel()
                return

    async def _serve(self, request_id: RequestId, work: Work, in_flight: _InFlight) -> None:
        try:
            with in_flight.scope:
                try:
                    answer = result_message(request_id, await work())
                except RpcError as exc:
                    answer = error_message(request_id, exc.code, exc.message, exc.data)
                except ClientGone:
                    return
                except Exception:
                    log.exception("internal error while answering request %r", request_id)
                    answer = error_message(request_id, INTERNAL_ERROR, "Internal error")
                await self._answer(answer)
            if in_flight.scope.cancelled_caught and not in_flight.by_client:
                # Stopped because the client went away: say so, if it still listens.
                closed = error_message(request_id, CONNECTION_CLOSED, "Connection closed")
                with anyio.move_on_after(_LAST_WRITE_LIMIT, shield=True):
                    await self._answer(closed)
        finally:
            self._in_flight.pop(request_id, None)

    async def _answer(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ClientGone):
            await self.send(message)

    def _close(self) -> None:
        """No more input: our requests will not be answered."""
        if self.closed:
            return
        self.closed = True
        self._reading.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_result(
                    Response(0, None, RpcError(CONNECTION_CLOSED, "Connection closed"))
                )

    # -- sending ----------------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message (whole, never interleaved with another); :class:`ClientGone`
        once the client cannot read any more."""
        data = memoryview(encode(message))
        if not self._write_lock.locked():  # nobody is mid-line: write now, without a turn of
            data = self._write_some(data)  # the loop (the usual case: it all fits)
            if not data:
                return
            # What is left is this line's: it goes on before any other.
            self._write_lock.acquire_nowait()
        else:
            await self._write_lock.acquire()
        try:
            # Once begun, a line is finished: half a message would garble every later one.
            with anyio.CancelScope(shield=True):
                while data:
                    data = self._write_some(data)
                    if data:
                        await anyio.wait_writable(self._write_fd)
        finally:
            self._write_lock.release()

    def _write_some(self, data: memoryview) -> memoryview:
        """What is left of ``data`` after one write (all of it if the pipe is full)."""
        try:
            written = os.write(self._write_fd, data)
        except BlockingIOError:
            return data
        except (BrokenPipeError, ConnectionResetError):
            self._close()
            raise ClientGone("the MCP client is gone") from None
        return data[written:]

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and wait for its result (:class:`RpcError`: its error
        answer). Cancelled while waiting, it tells the client (``notifications/cancelled``)."""
        if self.closed:
            raise RpcError(CONNECTION_CLOSED, "Connection closed")
        request_id = next(self._ids)
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            await self.send(message)
            try:
                response = await future
            except BaseException:  # cancelled: the client may stop asking its human
                if not self.closed:
                    cancel = {"requestId": request_id, "reason": "caller cancelled"}
                    with anyio.move_on_after(_LAST_WRITE_LIMIT, shield=True):
                        with contextlib.suppress(ClientGone):
                            await self.notify("notifications/cancelled", cancel)
                raise
        finally:
            self._pending.pop(request_id, None)
        if response.error is not None:
            raise response.error
        return response.result or {}
