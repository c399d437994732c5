"""Moving bytes between two connected sockets, both ways, until both sides are done.

``splice(2)`` through a pipe, in a worker thread per direction: the data goes from one socket
to the other inside the kernel and never becomes a Python object, and a bulk transfer costs two
system calls per megabyte, no event-loop round trip: that is what lets a tunnel keep up with a
direct transfer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket

import anyio
import anyio.to_thread

_CHUNK = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = os.SPLICE_F_MOVE


async def send_all(sock: socket.socket, data: bytes | memoryview) -> None:
    """Write all of ``data`` to a non-blocking socket."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            await anyio.wait_writable(sock)
            continue
        view = view[sent:]


async def recv_some(sock: socket.socket, limit: int = 65536) -> bytes:
    """What a non-blocking socket has (waiting for it); ``b""`` at end of stream."""
    while True:
        try:
            return sock.recv(limit)
        except BlockingIOError:
            await anyio.wait_readable(sock)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """source -> sink until source's end of stream (blocking: runs in a worker thread); then
    shut sink's writing side. A reset or a shutdown of either socket ends it."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, _CHUNK)
        while got := os.splice(source.fileno(), write_end, _CHUNK, flags=_FLAGS):
            while got:
                got -= os.splice(read_end, sink.fileno(), got, flags=_FLAGS)
    except OSError:
        pass
    finally:
        os.close(read_end)
        os.close(write_end)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


#: Relay threads: two per tunnel (blocking splice moves a bulk transfer with no event-loop
#: round trip per chunk).
_THREADS = anyio.CapacityLimiter(2048)


async def relay(a: socket.socket, b: socket.socket) -> None:
    """Both directions at once; returns when both ended. Cancelled (the session ends), it
    shuts both sockets down, which ends the threads' blocking calls, and waits for them: no
    thread ever touches a descriptor after its socket is closed."""
    a.setblocking(True)
    b.setblocking(True)
    running = 2

    async def one_way(source: socket.socket, sink: socket.socket) -> None:
        nonlocal running
        try:
            await anyio.to_thread.run_sync(_pump, source, sink, limiter=_THREADS)
        finally:
            running -= 1
            if running == 0:
                group.cancel_scope.cancel()  # both done: stop the watcher

    async def shut_down_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    async with anyio.create_task_group() as group:
        group.start_soon(shut_down_when_cancelled)
        group.start_soon(one_way, a, b)
        group.start_soon(one_way, b, a)
