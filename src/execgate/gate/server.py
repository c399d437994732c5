"""The gate socket: accept a connection per exec, read its request, answer.

This is the per-exec hot path on the Python side, so it stays off asyncio's stream machinery:
the listening socket is watched with ``add_reader``; each accepted connection is read once with
``recvmsg`` (a request is one small frame with the descriptors of the files it would run; when
we woke on the connect, before the frame was sent, a reader waits for it) and answered
synchronously when the decision needs no human. Only big requests and questions to a human
become tasks; how many requests may be arriving at once, for how long and how many bytes
they may hold is bounded (a gated process must not make the server grow without limit: excess
connections are closed, and the client fails closed). Escalation claims do not come here:
the launcher serves them (protocol §4).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import select
import socket
import struct
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Protocol

from execgate.gate.protocol import (
    HEADER,
    MAX_INTERPRETERS,
    MAX_PAYLOAD,
    ExecRequest,
    ProtocolError,
    parse_exec_request,
    split_payload,
)

log = logging.getLogger("execgate.gate")

_FIRST_READ = 65536
_PEERCRED = struct.Struct("3i")
_INT = array.array("i")
# A request carries the program and one descriptor per #! interpreter.
_MAX_REQUEST_FDS = 1 + MAX_INTERPRETERS
# Requests that did not arrive in one read are held at most this many at a time, together at
# most this many bytes (one maximal frame fits), each for at most this long.
MAX_SLOW_REQUESTS = 8
MAX_BUFFERED_BYTES = MAX_PAYLOAD + (1 << 20)
SLOW_REQUEST_SECONDS = 30.0
# How long the server waits, blocking, for the first bytes of a request whose connect woke it.
FIRST_BYTES_WAIT = 0.0005

Reply = bytes | Awaitable[bytes]


class Peer:
    """Who is on the other end of a gate connection (from ``SO_PEERCRED``)."""

    __slots__ = ("gid", "pid", "uid")

    def __init__(self, sock: socket.socket) -> None:
        self.pid, self.uid, self.gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )


class RequestHandler(Protocol):
    def answer_exec(self, request: ExecRequest, fds: Sequence[int], peer: Peer) -> Reply:
        """The framed answer to an exec request, or an awaitable of it (a human is asked, or
        an escalation is being authorized). ``fds``: the descriptors that came with it, open
        until the answer has been sent."""
        ...

    def refused(self, peer: Peer, why: str) -> None:
        """A request refused before it could be judged (malformed, too slow, too many)."""
        ...


class GateServer:
    def __init__(
        self, path: Path, handler: RequestHandler, listener: socket.socket | None = None
    ) -> None:
        """``listener``: the socket at ``path``, bound and listening already (the native
        front's, docs/protocol.md §8); else it is made here."""
        self.path = path
        self._handler = handler
        self._uid = os.geteuid()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slow: set[socket.socket] = set()  # requests still arriving
        self._awaited: dict[socket.socket, asyncio.TimerHandle] = {}  # ...their first bytes
        self._buffered = 0  # bytes those hold
        if listener is None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(os.fspath(path))
            # Connectable from inside the sandbox by the same user only (the folder is 0700).
            os.chmod(path, 0o600)
            listener.listen(socket.SOMAXCONN)
        self._listener = listener
        self._listener.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._listener.fileno(), self._on_readable)

    async def aclose(self) -> None:
        if self._listener.fileno() >= 0:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
        for conn in list(self._awaited):
            self._stop_awaiting(conn)
            conn.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_readable(self) -> None:
        # One connection per wake-up: the listener is level-triggered, so the loop comes back
        # at once for the next, and the common case avoids a failing accept() per request.
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError as exc:
            # EMFILE and friends: the waiting client is not answered yet (it fails closed if
            # it gives up). Pause, or the level-triggered listener would spin the loop.
            log.error("gate: accept failed: %s", exc)
            self._loop.remove_reader(self._listener.fileno())
            self._loop.call_later(0.05, self._resume)
            return
        try:
            self._serve(conn)
        except Exception:  # never let one connection take the server down
            log.exception("gate: request failed")
            conn.close()

    def _resume(self) -> None:
        if self._listener.fileno() >= 0:
            self._loop.add_reader(self._listener.fileno(), self._on_readable)

    def _serve(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        peer = Peer(conn)
        if peer.uid not in (self._uid, 0):
            log.warning("gate: refused a connection from uid %d (pid %d)", peer.uid, peer.pid)
            conn.close()
            return
        try:
            # (no wait while the unfinished requests are at their bound: the wait holds the
            # event loop, so a process that connects and never sends must not get many)
            data, fds = _first_read(conn, wait=len(self._slow) < MAX_SLOW_REQUESTS)
        except BlockingIOError:
            # Connected, not sent yet (we woke on connect): wait for the first bytes with a
            # reader and a timer, cheaper than a task. It holds a place among the unfinished
            # requests meanwhile.
            if not self._hold(conn, peer):
                return
            timer = self._loop.call_later(SLOW_REQUEST_SECONDS, self._give_up, conn, peer)
            self._awaited[conn] = timer
            self._loop.add_reader(conn.fileno(), self._on_first_bytes, conn, peer)
            return
        except (OSError, ProtocolError) as exc:
            self._refuse_bad(conn, peer, exc)
            return
        self._serve_read(conn, data, fds, peer)

    def _refuse_bad(self, conn: socket.socket, peer: Peer, exc: Exception) -> None:
        log.warning("gate: bad request from pid %d: %s", peer.pid, exc)
        self._handler.refused(peer, f"bad request: {exc}")
        conn.close()

    def _hold(self, conn: socket.socket, peer: Peer, fds: list[int] | None = None) -> bool:
        """Count ``conn`` among the unfinished requests, or close it when there are too many."""
        if len(self._slow) >= MAX_SLOW_REQUESTS:
            # Memory is bounded per session: a process cannot make us hold many big frames.
            log.info("gate: too many unfinished requests; closed one from pid %d", peer.pid)
            self._handler.refused(peer, "too many unfinished requests")
            _close_all(fds or [])
            conn.close()
            return False
        self._slow.add(conn)
        return True

    def _stop_awaiting(self, conn: socket.socket) -> None:
        self._awaited.pop(conn).cancel()
        self._loop.remove_reader(conn.fileno())
        self._slow.discard(conn)

    def _give_up(self, conn: socket.socket, peer: Peer) -> None:
        log.info("gate: dropped a request from pid %d: timeout", peer.pid)
        self._handler.refused(peer, "dropped request: timeout")
        self._stop_awaiting(conn)
        conn.close()

    def _on_first_bytes(self, conn: socket.socket, peer: Peer) -> None:
        self._stop_awaiting(conn)
        try:
            try:
                data, fds = _recv_with_fds(conn, _FIRST_READ)
            except BlockingIOError:  # woken for nothing: read on as a slow request
                if self._hold(conn, peer):
                    self._spawn(self._serve_slowly(conn, b"", [], peer))
                return
            except (OSError, ProtocolError) as exc:
                self._refuse_bad(conn, peer, exc)
                return
            self._serve_read(conn, data, fds, peer)
        except Exception:  # never let one connection take the server down
            log.exception("gate: request failed")
            conn.close()

    def _serve_read(self, conn: socket.socket, data: bytes, fds: list[int], peer: Peer) -> None:
        """Answer a request whose first bytes were read (the program's descriptors ride on
        them, §2, §3); one that is not all there yet is read on by a task."""
        if len(data) >= HEADER.size:
            (length,) = HEADER.unpack_from(data)
            if HEADER.size + length <= len(data) and 0 < length <= MAX_PAYLOAD:
                self._dispatch(conn, data[HEADER.size : HEADER.size + length], fds, peer)
                return
        if not data and not fds:  # closed before sending anything
            self._handler.refused(peer, "dropped request: connection closed mid-frame")
            conn.close()
            return
        if self._hold(conn, peer, fds):
            self._spawn(self._serve_slowly(conn, data, fds, peer))

    async def _serve_slowly(
        self, conn: socket.socket, data: bytes, fds: list[int], peer: Peer
    ) -> None:
        """A request that did not arrive in one read (big argv, slow client), within a time
        limit and the session's budget of buffered bytes."""
        buffer = bytearray(data)
        self._buffered += len(buffer)
        try:
            async with asyncio.timeout(SLOW_REQUEST_SECONDS):
                while True:
                    if len(buffer) >= HEADER.size:
                        (length,) = HEADER.unpack_from(buffer)
                        if not 0 < length <= MAX_PAYLOAD:
                            raise ProtocolError(f"bad frame length {length}")
                        if len(buffer) >= HEADER.size + length:
                            break
                    await self._readable(conn)
                    try:
                        if buffer:  # descriptors only ride on the first bytes: none now
                            chunk = conn.recv(1 << 20)
                        else:
                            chunk, fds = _recv_with_fds(conn, 1 << 20)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        raise ProtocolError("connection closed mid-frame")
                    if self._buffered + len(chunk) > MAX_BUFFERED_BYTES:
                        raise ProtocolError("the session's request buffers are full")
                    self._buffered += len(chunk)
                    buffer += chunk
        except (OSError, ProtocolError, TimeoutError) as exc:
            log.info("gate: dropped a request from pid %d: %s", peer.pid, exc or "timeout")
            self._handler.refused(peer, f"dropped request: {exc or 'timeout'}")
            _close_all(fds)
            conn.close()
            return
        finally:
            self._buffered -= len(buffer)
            self._slow.discard(conn)
        self._dispatch(conn, bytes(buffer[HEADER.size : HEADER.size + length]), fds, peer)

    async def _readable(self, conn: socket.socket) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        fd = conn.fileno()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_reader(fd)

    def _dispatch(self, conn: socket.socket, payload: bytes, fds: list[int], peer: Peer) -> None:
        try:
            fields = split_payload(payload)
            if fields[0] != b"exec":  # claims go to the launcher's claim socket (§4)
                raise ProtocolError(f"unknown message {fields[0][:20]!r}")
            answer = self._handler.answer_exec(parse_exec_request(fields), fds, peer)
        except ProtocolError as exc:
            log.warning("gate: malformed request from pid %d: %s", peer.pid, exc)
            self._handler.refused(peer, f"malformed request: {exc}")
            _close_all(fds)
            conn.close()
            return
        except BaseException:
            _close_all(fds)
            raise
        if isinstance(answer, bytes):
            _close_all(fds)
            _send_and_close(conn, answer)
        else:
            self._spawn(self._answer_later(conn, answer, fds))

    async def _answer_later(
        self, conn: socket.socket, answer: Awaitable[bytes], fds: list[int]
    ) -> None:
        try:
            frame = await answer
            await self._loop.sock_sendall(conn, frame)
        except OSError:
            pass  # the asking process is gone
        finally:
            _close_all(fds)
            conn.close()


def _first_read(conn: socket.socket, *, wait: bool) -> tuple[bytes, list[int]]:
    """The first bytes of a request just accepted. The connect woke us, and the client, which
    sends right after it, was often preempted by that very wake-up: when nothing is there
    yet and ``wait``, sleep until it is, at most :data:`FIRST_BYTES_WAIT` (the client sends
    as soon as it runs again), before falling back to a reader (another turn of the event
    loop, timers, two more wake-ups). BlockingIOError: still nothing."""
    try:
        return _recv_with_fds(conn, _FIRST_READ)
    except BlockingIOError:
        if not wait:
            raise
    waiting = select.poll()
    waiting.register(conn.fileno(), select.POLLIN)
    waiting.poll(FIRST_BYTES_WAIT * 1000)
    return _recv_with_fds(conn, _FIRST_READ)


def _recv_with_fds(conn: socket.socket, size: int) -> tuple[bytes, list[int]]:
    """Read what is there, with the descriptors attached to it (close-on-exec). More than a
    request may carry is an error (the kernel may have dropped some: never judge a part)."""
    data, ancillary, flags, _ = conn.recvmsg(
        size, socket.CMSG_SPACE(_MAX_REQUEST_FDS * _INT.itemsize), socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(blob) - len(blob) % _INT.itemsize
            fds.extend(array.array("i", blob[:usable]))
    if flags & socket.MSG_CTRUNC or len(fds) > _MAX_REQUEST_FDS:
        _close_all(fds)
        raise ProtocolError("too many descriptors")
    return data, fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def _send_and_close(conn: socket.socket, frame: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.send(frame)  # small, into an empty socket buffer: never blocks
    conn.close()
