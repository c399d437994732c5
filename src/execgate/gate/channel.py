"""An asyncio channel of EG1 frames over a Unix stream socket, with descriptor passing.

asyncio has no awaitable ``recvmsg`` with ancillary data, so this reads the socket directly
when the loop says it is readable. Descriptors ride on the frame header (protocol §2): the
header is read on its own with ``recvmsg`` so they are always attached to the right frame.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
from collections.abc import Sequence

from execgate.gate.protocol import HEADER, MAX_FDS, MAX_PAYLOAD, ProtocolError, split_payload
from execgate.readable import ReadableWatch

_ANCILLARY = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class ChannelClosed(Exception):
    """The peer closed the connection (cleanly between frames, or in the middle of one)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._input = ReadableWatch(sock.fileno())  # (read frame after frame)

    def close(self) -> None:
        self._input.close()
        self.sock.close()

    async def _writable(self) -> None:
        fd = self.sock.fileno()
        waiter = self._loop.create_future()
        self._loop.add_writer(fd, waiter.set_result, None)
        try:
            await waiter
        finally:
            self._loop.remove_writer(fd)

    async def recv(self) -> tuple[list[bytes], list[int]]:
        """The next frame's fields (after the tag) and the descriptors it carried.

        Raises :class:`ChannelClosed` at EOF and :class:`ProtocolError` on a malformed frame
        (received descriptors are closed then).
        """
        header = bytearray()
        fds: list[int] = []
        try:
            while len(header) < HEADER.size:
                try:
                    data, ancdata, flags, _ = self.sock.recvmsg(
                        HEADER.size - len(header), _ANCILLARY if not header else 0
                    )
                except BlockingIOError:
                    await self._input.wait()
                    continue
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        got = array.array("i")
                        got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                        fds.extend(got)
                if flags & socket.MSG_CTRUNC:
                    raise ProtocolError("descriptors were truncated")
                if not data:
                    raise ChannelClosed("connection closed" if not header else "closed mid-frame")
                header += data
            (length,) = HEADER.unpack(header)
            if length == 0 or length > MAX_PAYLOAD:
                raise ProtocolError(f"bad frame length {length}")
            buffer = bytearray(length)
            view = memoryview(buffer)
            got_bytes = 0
            while got_bytes < length:
                try:
                    n = self.sock.recv_into(view[got_bytes:])
                except BlockingIOError:
                    await self._input.wait()
                    continue
                if n == 0:
                    raise ChannelClosed("closed mid-frame")
                got_bytes += n
            fields = split_payload(bytes(buffer))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        for fd in fds:
            os.set_inheritable(fd, False)
        return fields, fds

    async def send(self, frame: bytes, fds: Sequence[int] = ()) -> None:
        """Send one complete frame (from :func:`protocol.encode`), descriptors on its header."""
        if len(fds) > MAX_FDS:
            raise ProtocolError(f"too many fds: {len(fds)}")
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        while True:
            try:
                sent = self.sock.sendmsg([frame], ancillary)
                break
            except BlockingIOError:
                await self._writable()
        if sent < len(frame):
            await self._loop.sock_sendall(self.sock, frame[sent:])
