"""Program identity by content: which rule-named program a file is a copy of.

A rule names files (``rm`` stands for ``/usr/bin/rm``), but a gated process can copy a file
under any name, anywhere (``cp /usr/bin/rm ./x``, a memfd), and the copy runs the same code.
The snapshot records the size of every rule-named file (docs/protocol.md §6); the interposer
asks about a program of such a size, and the server hashes it, from the descriptor the request
carries, and maps a matching digest to the rule names of the file it copies. A changed copy is
just another program.

Hashing costs ~2.5 ms per MiB here, so digests are cached by ``(dev, ino, size, mtime_ns,
ctime_ns)``, but only for files whose ``ctime`` was already a second old when they were read:
any later change sets ``ctime`` to a later time than the cached one (the kernel's coarse clock
ticks far more often than that), so the key cannot match changed content.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Digest = bytes  # SHA-256 of a file's bytes

# Larger files are not hashed (it would block the server for seconds): a program of the very
# size of such a rule-named file is denied, never guessed at (fail closed).
MAX_HASHED_SIZE = 256 << 20
_CHUNK = 1 << 20
_SETTLED_NS = 1_000_000_000  # ctime older than this: the digest may be cached
_CACHE_LIMIT = 4096

_CacheKey = tuple[int, int, int, int, int]
_digests: dict[_CacheKey, Digest] = {}


class ContentError(Exception):
    """The file's content cannot be compared with the rule-named files (deny the exec)."""


def _key(st: os.stat_result) -> _CacheKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _readable(fd: int) -> int:
    """A descriptor that reads the file behind ``fd``: ``fd`` itself, or for an ``O_PATH``
    descriptor the same file opened again through its ``/proc/self/fd`` link (checked to be the
    same inode). The caller closes it when it differs from ``fd``."""
    try:
        os.pread(fd, 1, 0)
        return fd
    except OSError:
        pass
    try:
        again = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ContentError(f"it cannot be read ({exc.strerror})") from None
    before, after = os.fstat(fd), os.fstat(again)
    if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
        os.close(again)
        raise ContentError("it was replaced while it was being read")
    return again


def file_digest(fd: int, st: os.stat_result | None = None) -> Digest:
    """SHA-256 of the file behind ``fd`` (read from the descriptor, never by path), at most
    :data:`MAX_HASHED_SIZE` bytes; :class:`ContentError` when it cannot be read whole."""
    if st is None:
        st = os.fstat(fd)
    key = _key(st)
    cached = _digests.get(key)
    if cached is not None:
        return cached
    if st.st_size > MAX_HASHED_SIZE:
        raise ContentError(f"it is too large to compare ({st.st_size} bytes)")
    started = time.time_ns()
    reader = _readable(fd)
    try:
        digest = hashlib.sha256()
        offset = 0
        while offset <= st.st_size:  # one read past the end: the file did not grow
            chunk = os.pread(reader, _CHUNK, offset)
            if not chunk:
                break
            digest.update(chunk)
            offset += len(chunk)
    except OSError as exc:
        raise ContentError(f"it cannot be read ({exc.strerror})") from None
    finally:
        if reader != fd:
            os.close(reader)
    if offset != st.st_size:
        raise ContentError("it changed while it was being read")
    value = digest.digest()
    if st.st_ctime_ns < started - _SETTLED_NS:
        if len(_digests) >= _CACHE_LIMIT:
            _digests.clear()
        _digests[key] = value
    return value


@dataclass(frozen=True)
class ContentIndex:
    """The contents of the files some rule names, by size and digest.

    ``sizes``: the size of every rule-named file (the snapshot's size table; a program of
    another size is no copy). ``names``: digest → the rule names of the files with that content
    (the dynamic loader's files under their paths). ``unhashed``: size → the rule names of
    rule-named files too large to hash; a program of that size cannot be cleared.
    """

    sizes: frozenset[int] = frozenset()
    names: Mapping[Digest, tuple[str, ...]] = field(default_factory=dict)
    unhashed: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def names_of(self, fd: int, st: os.stat_result) -> tuple[str, ...]:
        """The rule names of the program whose content the file behind ``fd`` has (() when it
        copies none); :class:`ContentError` when that cannot be told."""
        if st.st_size not in self.sizes or not stat.S_ISREG(st.st_mode):
            return ()
        if st.st_size in self.unhashed:
            names = ", ".join(self.unhashed[st.st_size])
            raise ContentError(f"it has the size of {names}, too large to compare")
        return self.names.get(file_digest(fd, st), ())


NO_CONTENTS = ContentIndex()  # a policy that names no file


def build_index(files: Iterable[tuple[str, tuple[str, ...]]]) -> ContentIndex:
    """The index of ``files``: (path, rule names) pairs. A file that cannot be opened is left
    out (nobody can copy what nobody can read); an empty file runs nothing and is left out."""
    sizes: set[int] = set()
    names: dict[Digest, set[str]] = {}
    unhashed: dict[int, set[str]] = {}
    for path, rule_names in files:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                continue  # (opening a device can have effects)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                continue
            sizes.add(st.st_size)
            try:
                names.setdefault(file_digest(fd, st), set()).update(rule_names)
            except ContentError:
                unhashed.setdefault(st.st_size, set()).update(rule_names)
        finally:
            os.close(fd)
    return ContentIndex(
        frozenset(sizes),
        {digest: tuple(sorted(n)) for digest, n in names.items()},
        {size: tuple(sorted(n)) for size, n in unhashed.items()},
    )
