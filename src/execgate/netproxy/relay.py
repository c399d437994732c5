"""Moving bytes between two connected sockets, both ways, until both sides are done.

``splice(2)`` through a pipe: the data goes from one socket to the other inside the kernel and
never becomes a Python object, which is what lets a tunnel keep up with a direct transfer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket

import anyio

_CHUNK = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


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


async def _pump(source: socket.socket, sink: socket.socket) -> int:
    """source -> sink until source's end of stream; then shut sink's writing side."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    moved = 0
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, _CHUNK)
        in_pipe = 0
        while True:
            if in_pipe == 0:
                try:
                    got = os.splice(source.fileno(), write_end, _CHUNK, flags=_FLAGS)
                except BlockingIOError:
                    await anyio.wait_readable(source)
                    continue
                if got == 0:
                    break
                in_pipe = got
            try:
                out = os.splice(read_end, sink.fileno(), in_pipe, flags=_FLAGS)
            except BlockingIOError:
                await anyio.wait_writable(sink)
                continue
            in_pipe -= out
            moved += out
    finally:
        os.close(read_end)
        os.close(write_end)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
    return moved


async def relay(a: socket.socket, b: socket.socket) -> None:
    """Both directions at once; returns when both ended (a reset ends both)."""

    async def one_way(source: socket.socket, sink: socket.socket) -> None:
        try:
            await _pump(source, sink)
        except OSError:
            scope.cancel()

    async with anyio.create_task_group() as group:
        scope = group.cancel_scope
        group.start_soon(one_way, a, b)
        group.start_soon(one_way, b, a)
