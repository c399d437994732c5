"""Rules hot reload: notice that a rules file changed and swap the policy in.

Changes are found by comparing stat signatures (inode, size, mtime, ctime; ``None`` for a
missing path) of every path the loaded policy depends on -- its files and the folders that
could gain files. That is a few ``stat`` calls: cheap enough to do before every tool call (so
a call always runs with the rules as they are on disk when it starts) and once a second in
between (``execgate run``: once a second). A reload evaluates Starlark (about a second for a
big file) in a worker thread.
A change that does not load keeps the previous policy; the reason is logged once per change,
with the file and line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from execgate.errors import ExecgateError

log = logging.getLogger("execgate.reload")

Signature = tuple[tuple[int, int, int, int] | None, ...]
T = TypeVar("T")


def signature(paths: Sequence[Path]) -> Signature:
    result: list[tuple[int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            result.append(None)
        else:
            result.append(stat_signature(st))
    return tuple(result)


def stat_signature(st: os.stat_result) -> tuple[int, int, int, int]:
    """One path's part of a :data:`Signature`."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """A freshly loaded policy and the paths to watch from now on (opaque to the reloader)."""

    value: T
    watch_paths: list[Path]


class PolicyReloader(Generic[T]):
    """``load()`` (run in a thread) builds a new policy; ``apply()`` (on the loop) installs it."""

    def __init__(
        self,
        load: Callable[[], Loaded[T]],
        apply: Callable[[Loaded[T]], None],
        watch_paths: list[Path],
        *,
        interval: float = 1.0,
        since: Signature | None = None,
    ) -> None:
        """``since``: the signature the loaded policy stands for (default: the paths now);
        a change after it is a reload."""
        self._load = load
        self._apply = apply
        self._paths = list(watch_paths)
        self._current = signature(self._paths) if since is None else since
        self._failed: Signature | None = None
        self._lock = asyncio.Lock()
        self.interval = interval
        self.reloads = 0

    def changed(self) -> bool:
        now = signature(self._paths)
        return now != self._current and now != self._failed

    async def check(self) -> None:
        """Reload now if anything changed since the last load (or failed attempt)."""
        if not self.changed():
            return
        async with self._lock:
            paths = self._paths
            before = signature(paths)
            if before in (self._current, self._failed):
                return  # someone else reloaded while we waited for the lock
            try:
                loaded = await asyncio.to_thread(self._load)
            except ExecgateError as exc:
                self._failed = before
                log.warning("rules changed but cannot be used; keeping the previous rules: %s", exc)
                return
            except Exception as exc:
                self._failed = before
                log.exception("rules reload failed; keeping the previous rules: %s", exc)
                return
            self._apply(loaded)
            self._paths = list(loaded.watch_paths)
            # Signature from before the load, so an edit made during the load is seen next
            # time; when the load found new paths to watch, they can only be taken now.
            self._current = before if self._paths == paths else signature(self._paths)
            self._failed = None
            self.reloads += 1
            log.info("rules reloaded")

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Poll (:meth:`run`) while the block runs."""
        poller = asyncio.ensure_future(self.run())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def run(self) -> None:
        """Poll forever (cancel to stop)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # never let the watcher die
                log.exception("rules watcher failed")
