"""Waiting for a descriptor to turn readable, with one registration for many waits.

Registering a descriptor with the event loop for each wait (``loop.add_reader`` then
``remove_reader``, as ``anyio.wait_readable`` does) costs two ``epoll_ctl`` calls and the
Python around them for every message; on the ``shell`` round trip that is the client's request
and the launcher's report of the shell's exit. A :class:`ReadableWatch` stays registered from
one wait to the next. It unregisters only when the descriptor turns readable while nobody
waits for it and nobody is about to read it: the loop's selector is level-triggered, and would
otherwise wake the loop at every turn.
"""

from __future__ import annotations

import asyncio


class ReadableWatch:
    """Readability of ``fd`` on the running loop, for one reader at a time. Call
    :meth:`close` before the descriptor is closed (the loop's table is keyed by its number)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        # Set while a reader waits, and until it has run again after being woken.
        self._waiter: asyncio.Future[None] | None = None
        self._registered = False

    async def wait(self) -> None:
        """Return once the descriptor is readable (data, or the other end closed)."""
        if self._waiter is not None:
            raise RuntimeError("another reader is waiting on this descriptor")
        waiter = self._waiter = self._loop.create_future()
        try:
            if not self._registered:
                self._loop.add_reader(self._fd, self._on_readable)
                self._registered = True
            await waiter
        finally:
            self._waiter = None

    def _on_readable(self) -> None:
        waiter = self._waiter
        if waiter is None:  # nobody will read it soon: stop watching until someone waits
            self.close()
        elif not waiter.done():
            waiter.set_result(None)
        # (done: its reader runs in this turn of the loop, and reads)

    def close(self) -> None:
        if self._registered:
            self._registered = False
            self._loop.remove_reader(self._fd)
