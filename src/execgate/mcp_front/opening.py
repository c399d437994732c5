"""The first answers of ``execgate mcp``, given while the rest of the server starts.

A client waits for the answer to its ``initialize`` (or, 2026-07-28, ``server/discover``)
before it does anything else, and that answer needs nothing but the server's own description
(:mod:`.protocol`). So the main thread claims stdio and answers the opening requests at once,
while a :class:`Preparation` thread imports the server, reads the configuration and loads the
policy. As soon as a request needs more (a tool call, ``tools/list``) or the preparation is
done, :func:`answer_opening` hands what it read but did not answer, and the state of the
handshake, to the server proper (:mod:`.server`), which continues the same connection.

Imports only the standard library's cheapest modules: this is the path to the first answer.
"""

from __future__ import annotations

import fcntl
import os
import select
import threading
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

from execgate.errors import ExecgateError
from execgate.mcp_front.protocol import (
    Client,
    discover_result,
    envelope,
    handshake,
    has_envelope,
    modern_result,
)
from execgate.mcp_front.wire import Notification, Request, RpcError, encode, read_message

T = TypeVar("T")
_READ_SIZE = 1 << 16


class Stdio(NamedTuple):
    """The client's pipes, on private descriptors (close-on-exec)."""

    read_fd: int
    write_fd: int


def claim_stdio() -> Stdio:
    """Move the protocol channel off fds 0 and 1: from now on fd 0 reads /dev/null and fd 1
    writes to stderr, so nothing this process or a child writes by mistake reaches the wire."""
    try:
        read_fd = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
        write_fd = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        raise ExecgateError(
            "execgate mcp talks to its client on standard input and output, and one of them "
            "is closed"
        ) from None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return Stdio(read_fd, write_fd)


class Preparation(Generic[T]):
    """``prepare()`` run in a thread of its own; :meth:`result` waits for it (and raises what
    it raised). :attr:`done_fd` becomes readable when it is done."""

    def __init__(self, prepare: Callable[[], T]) -> None:
        self._prepare = prepare
        self._value: T | None = None
        self._error: BaseException | None = None
        self.done_fd, self._done_write = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="execgate-prepare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._prepare()
        except BaseException as exc:  # handed to the main thread, which reports it
            self._error = exc
        finally:
            os.write(self._done_write, b"x")

    def result(self) -> T:
        self._thread.join()
        for fd in (self.done_fd, self._done_write):
            os.close(fd)
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


class Opening(NamedTuple):
    """What the opening left for the server: the era and client it settled, what it read but
    did not answer, and whether the client closed its end."""

    era: str | None = None
    client: Client | None = None
    unread: bytes = b""
    eof: bool = False


def answer_opening(stdio: Stdio, ready_fd: int) -> Opening:
    """Answer ``initialize``, ``server/discover`` and ``ping`` until a message needs the server
    or ``ready_fd`` (the preparation) says the server is there."""
    era: str | None = None
    client: Client | None = None
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, rest = buffer.split(b"\n", 1)
            answered = _answer(line, era, client) if line.strip() else (era, client, None)
            if answered is None:
                return Opening(era, client, buffer)
            era, client, answer = answered
            if answer is not None:
                try:
                    _write_all(stdio.write_fd, encode(answer))
                except OSError:  # the client is gone
                    return Opening(era, client, b"", eof=True)
            buffer = rest
        readable, _, _ = select.select([stdio.read_fd, ready_fd], [], [])
        if stdio.read_fd not in readable:
            return Opening(era, client, buffer)
        try:
            chunk = os.read(stdio.read_fd, _READ_SIZE)
        except OSError:
            chunk = b""
        if not chunk:
            return Opening(era, client, buffer, eof=True)
        buffer += chunk


_Answered = tuple[str | None, Client | None, dict[str, Any] | None]


def _answer(line: bytes, era: str | None, client: Client | None) -> _Answered | None:
    """The answer to one line and the state after it; None: the server must answer it."""
    message = read_message(line)
    if isinstance(message, Notification):
        if message.method == "notifications/initialized" and era == "handshake":
            return (era, client, None)
        return None
    if not isinstance(message, Request):
        return None
    method, params = message.method, message.params or {}
    try:
        if method == "initialize" and era is None:
            client, result = handshake(params)
            era = "handshake"
        elif method == "server/discover" and era in (None, "modern") and has_envelope(params):
            envelope(params)
            era = "modern"
            result = modern_result(method, discover_result())
        elif method == "ping" and era in (None, "handshake") and not has_envelope(params):
            era = "handshake"
            result = {}
        else:
            return None
    except RpcError:
        return None  # the server answers it, with everything else it has to say
    return (era, client, {"jsonrpc": "2.0", "id": message.id, "result": result})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
