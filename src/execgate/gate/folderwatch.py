"""Notice when entries of some folders are created, removed or renamed (inotify).

The policy snapshot and alias table record the file identity ``(dev, ino)`` of every file a rule
names. A file replaced at its path has a new identity, so they must be rebuilt when a folder
holding such a file changes (docs/protocol.md §6). The kernel queues an event when the change
happens, before the call that made it returns: draining the queue before judging an exec sees
every change made before that exec, whatever the timing.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import logging
import os
import termios
from collections.abc import Iterable

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_ONLYDIR = 0x01000000
_MASK = (
    _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF
    | _IN_ONLYDIR
)  # fmt: skip

log = logging.getLogger("execgate.gate")

# The process's own libc: find_library("c") would run `ldconfig -p` at every start-up.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_init1.argtypes = [ctypes.c_int]
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


class FolderWatch:
    """An inotify descriptor watching a set of folders. :meth:`drain` says whether anything
    happened in them since the last call; :meth:`fileno` is for an event loop's ``add_reader``.
    """

    def __init__(self) -> None:
        # Without inotify (out of instances: fs.inotify.max_user_instances) nothing can be
        # watched, so every drain reports a change: slower, never stale.
        self._fd: int = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            log.warning(
                "cannot watch the folders of rule-named programs (inotify: %s); "
                "every decision re-reads them",
                os.strerror(ctypes.get_errno()),
            )
        self._folders: set[str] = set()

    def __del__(self) -> None:
        self.close()

    def fileno(self) -> int | None:
        return self._fd if self._fd >= 0 else None

    def watch(self, folders: Iterable[str]) -> set[str]:
        """Watch these folders too (again, for one that was removed and made anew); missing
        ones are skipped. Returns the folders that were not watched before."""
        added: set[str] = set()
        if self._fd < 0:
            return added
        for folder in folders:
            watched = _libc.inotify_add_watch(self._fd, os.fsencode(folder), _MASK) >= 0
            if watched and folder not in self._folders:
                added.add(folder)
                self._folders.add(folder)
        return added

    def pending(self) -> bool:
        """Whether events are queued (unread): a change the next :meth:`drain` will see."""
        if self._fd < 0:
            return True
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, count, True)
        except OSError:
            return True
        return count[0] > 0

    def drain(self) -> bool:
        """Read every queued event; True if there was any (or the queue overflowed)."""
        if self._fd < 0:
            return True
        changed = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return changed
            changed = True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
