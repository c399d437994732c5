"""Program identity by content: which rule-named program a file is a copy of.

A rule names files (``rm`` stands for ``/usr/bin/rm``), but a gated process can copy a file
under any name, anywhere (``cp /usr/bin/rm ./x``, a memfd), and the copy runs the same code.
The snapshot records the size of every rule-named file (docs/protocol.md §6); the interposer
asks about a program of such a size, and the server hashes it, from the descriptor the request
carries, and the rule-named files of that size, and gives a match the rule names of the file it
copies. A changed copy is just another program.

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


@dataclass(frozen=True, slots=True)
class RuleFile:
    """A file some rule names: where it was found, its identity and the rule names it answers
    to (the dynamic loader's under its paths)."""

    path: str
    dev: int
    ino: int
    names: tuple[str, ...]


def _digest_at(path: str) -> Digest | None:
    """The digest of the regular file at ``path`` (opened ``O_PATH`` first: opening a device
    can have effects); None when it is gone or the server may not read it (nor may a gated
    process, which has no more rights: it cannot have copied it)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            reader = _readable(fd)
        except ContentError:
            return None
        try:
            return file_digest(reader, st)  # too large, changed while read: fail closed
        finally:
            if reader != fd:
                os.close(reader)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ContentIndex:
    """The files some rule names, by size (the snapshot's size table): a program of another
    size is no copy of any. Digests are computed only when a program of such a size is judged
    (hashing every rule-named file up front would cost seconds per session start: ``docker``,
    ``terraform`` and ``kubectl`` are 40-90 MB)."""

    by_size: Mapping[int, tuple[RuleFile, ...]] = field(default_factory=dict)

    @property
    def sizes(self) -> frozenset[int]:
        return frozenset(self.by_size)

    def names_of(self, fd: int, st: os.stat_result) -> tuple[str, ...]:
        """The rule names of the rule-named files whose content the file behind ``fd`` has
        (itself included; () when none); :class:`ContentError` when that cannot be told (too
        large to hash, unreadable, changed while read)."""
        candidates = self.by_size.get(st.st_size)
        if not candidates or not stat.S_ISREG(st.st_mode):
            return ()
        names: set[str] = set()
        digest: Digest | None = None
        for rule_file in candidates:
            if (rule_file.dev, rule_file.ino) == (st.st_dev, st.st_ino):
                names.update(rule_file.names)  # the very file: nothing to compare
                continue
            if digest is None:
                digest = file_digest(fd, st)
            if _digest_at(rule_file.path) == digest:
                names.update(rule_file.names)
        return tuple(sorted(names))


NO_CONTENTS = ContentIndex()  # a policy that names no file


def build_index(files: Iterable[tuple[str, tuple[str, ...]]]) -> ContentIndex:
    """The index of ``files``: (path, rule names) pairs, one entry per identity. Only regular
    files count; an empty file runs nothing and is left out."""
    found: dict[tuple[int, int], RuleFile] = {}
    sizes: dict[tuple[int, int], int] = {}
    for path, rule_names in files:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            continue
        known = found.get((st.st_dev, st.st_ino))
        names = tuple(sorted({*rule_names, *(known.names if known else ())}))
        found[(st.st_dev, st.st_ino)] = RuleFile(path, st.st_dev, st.st_ino, names)
        sizes[(st.st_dev, st.st_ino)] = st.st_size
    by_size: dict[int, list[RuleFile]] = {}
    for file_id, rule_file in found.items():
        by_size.setdefault(sizes[file_id], []).append(rule_file)
    return ContentIndex({size: tuple(group) for size, group in by_size.items()})
