"""A countdown that stands still while a human is being asked, driving a cancel scope.

``shell``'s ``timeout_ms`` and unified exec's ``yield_time_ms`` count only the time the command
runs, not the time a human takes to answer its approval questions. The stopwatch keeps that
account and moves the deadline of the cancel scope it is attached to: while paused the deadline
is infinite; on the last resume it becomes "now + what is left". ::

    stopwatch = Stopwatch(10.0)
    with anyio.CancelScope() as scope:
        stopwatch.attach(scope)
        await process.wait()
    if scope.cancelled_caught: ...   # ran out
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import anyio


class Stopwatch:
    """Pauses are reference counted: overlapping questions pause it once, and it runs again
    only when the last one is answered (a resume at count 0 does nothing). Time spent paused
    never counts, before or after."""

    def __init__(self, limit: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._banked = 0.0
        self._since: float | None = clock()
        self._pauses = 0
        self._scope: anyio.CancelScope | None = None

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    def elapsed(self) -> float:
        running = self._clock() - self._since if self._since is not None else 0.0
        return self._banked + running

    def remaining(self) -> float:
        """Running time left; infinite while paused."""
        return math.inf if self.paused else max(0.0, self.limit - self.elapsed())

    def attach(self, scope: anyio.CancelScope | None) -> None:
        """Let the stopwatch move ``scope``'s deadline (None: detach)."""
        self._scope = scope
        self._move_deadline()

    def restart(self, limit: float) -> None:
        """Count ``limit`` seconds from now (pauses in progress stay)."""
        self.limit = limit
        self._banked = 0.0
        if self._since is not None:
            self._since = self._clock()
        self._move_deadline()

    def pause(self) -> None:
        if self._pauses == 0 and self._since is not None:
            self._banked += self._clock() - self._since
            self._since = None
        self._pauses += 1
        self._move_deadline()

    def resume(self) -> None:
        if self._pauses == 0:
            return
        self._pauses -= 1
        if self._pauses == 0:
            self._since = self._clock()
            self._move_deadline()

    def asking(self, asking: bool) -> None:
        """``on_ask`` for a session: pause when a question starts, resume when it ends."""
        if asking:
            self.pause()
        else:
            self.resume()

    def _move_deadline(self) -> None:
        if self._scope is not None:
            left = self.remaining()
            self._scope.deadline = math.inf if math.isinf(left) else anyio.current_time() + left
