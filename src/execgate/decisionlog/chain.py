"""The decision log on disk: JSON lines, hash-chained, size-rotated, shared by every writer.

Every line is one JSON object whose ``prev`` is the SHA-256 (hex) of the line before it (its
bytes without the newline), so a changed, inserted or removed line breaks the chain at the
line after it. The chain runs on across rotation: the first line of a fresh file carries the
hash of the last line of the file it replaced.

Several sessions (processes) append at once. Each batch is written under an exclusive
``flock`` on a lock file beside the log, after reading the hash of the file's actual last line
(cached while nobody else wrote), with one ``write`` on an ``O_APPEND`` descriptor; rotation
happens under the same lock, and a writer whose descriptor was rotated away reopens the path.
So every writer's lines join one consistent chain.

Files: ``decisions.jsonl`` (current), ``decisions.1.jsonl`` (newest rotated) …
``decisions.<keep>.jsonl`` (oldest kept). On disk: at most ``(keep + 1) * max_bytes`` plus one
batch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from execgate.files import make_private_dir, open_private

#: ``prev`` of the first line ever written.
GENESIS = "0" * 64
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_KEEP = 4
_TAIL_CHUNK = 64 * 1024


class LogPathError(Exception):
    """The log cannot be used at this path (the message says why, in one sentence)."""


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def encode_line(record: Mapping[str, Any], prev: str) -> bytes:
    """One record as its line (without the newline), chained to ``prev``. ASCII only: a
    non-UTF-8 argument (a surrogate) stays a ``\\u`` escape and reads back as it was."""
    return json.dumps({**record, "prev": prev}, separators=(",", ":")).encode("ascii")


def rotated_path(path: Path, n: int) -> Path:
    """``decisions.jsonl`` → ``decisions.<n>.jsonl`` (``n`` = 0: the current file)."""
    if n == 0:
        return path
    return path.with_name(f"{path.stem}.{n}{path.suffix}")


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


class ChainedFile:
    """Appends to the chained log at ``path``; raises :class:`LogPathError` at once when the
    path cannot be a log (a folder, not writable, its folder cannot be made)."""

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        try:
            make_private_dir(path.parent)
            self._lock = open_private(lock_path(path), os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise LogPathError(f"cannot write the decision log {path}: {_why(exc)}") from None
        self._fd = -1
        self._ino = -1
        # (inode, size, hash of the last line) as this writer last left the file.
        self._tail: tuple[int, int, str] | None = None
        try:
            self._reopen()
        except OSError as exc:
            os.close(self._lock)
            raise LogPathError(f"cannot write the decision log {path}: {_why(exc)}") from None

    def _reopen(self) -> None:
        # O_NONBLOCK: a FIFO put in the log's place is refused below, not waited on
        fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise IsADirectoryError(21, "not a regular file")
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._ino = fd, st.st_ino

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append ``records`` as one batch (OSError when the disk refuses)."""
        if not records:
            return
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_ino != self._ino:
                    self._reopen()  # another writer rotated it
            if not os.path.exists(self.path):
                self._reopen()
            size = os.fstat(self._fd).st_size
            lead = b""
            if self._tail is not None and self._tail[:2] == (self._ino, size):
                prev = self._tail[2]
            else:
                last, complete = _last_line_hash(self.path, size)
                lead = b"" if complete else b"\n"  # a torn line stays one (broken) line
                prev = last if last is not None else self._prev_of_rotated()
            lines = []
            for record in records:
                line = encode_line(record, prev)
                prev = line_hash(line)
                lines.append(line)
            data = lead + b"\n".join(lines) + b"\n"
            if size and size + len(data) > self.max_bytes:
                self._rotate()
                data = data[len(lead) :]
                size = 0
            _write_all(self._fd, data)
            self._tail = (self._ino, size + len(data), prev)
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    def _prev_of_rotated(self) -> str:
        """The chain's last hash when the current file is empty: the newest rotated file's."""
        for n in range(1, self.keep + 1):
            older = rotated_path(self.path, n)
            with contextlib.suppress(OSError):
                found, _ = _last_line_hash(older, os.stat(older).st_size)
                if found is not None:
                    return found
        return GENESIS

    def _rotate(self) -> None:
        """Shift ``decisions.jsonl`` → ``.1`` → … → ``.<keep>`` (dropping the oldest), under
        the lock; then write on in a fresh file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rotated_path(self.path, self.keep))
        for n in range(self.keep - 1, -1, -1):
            with contextlib.suppress(FileNotFoundError):
                os.rename(rotated_path(self.path, n), rotated_path(self.path, n + 1))
        if self.keep == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self._reopen()

    def close(self) -> None:
        for fd in (self._fd, self._lock):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fd = self._lock = -1


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _last_line_hash(path: Path, size: int) -> tuple[str | None, bool]:
    """Hash of the last line of ``path`` (None: empty file), and whether the file ends with a
    newline (False: its last line was torn)."""
    if size == 0:
        return None, True
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # (a FIFO: no wait)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(21, "not a regular file")
    with open(fd, "rb") as f:
        end = size
        f.seek(end - 1)
        complete = f.read(1) == b"\n"
        if complete:
            end -= 1
        tail = b""
        while True:
            start = max(0, end - len(tail) - _TAIL_CHUNK)
            f.seek(start)
            tail = f.read(end - start)
            newline = tail.rfind(b"\n")
            if newline >= 0 or start == 0:
                return line_hash(tail[newline + 1 :]), complete


# -- reading ----------------------------------------------------------------------------------


# NamedTuples, not dataclasses: this module stays cheap to import (dataclasses imports inspect,
# re, ast: tens of ms). (native/chain.c is the other writer: the native front's first record.)
class Line(NamedTuple):
    file: Path
    number: int  # 1-based, within ``file``
    raw: bytes
    record: dict[str, Any] | None  # None: not a JSON object


def log_files(path: Path) -> list[Path]:
    """The log's files that exist, oldest first (rotation keeps them numbered 1, 2, … with
    no gap)."""
    older = []
    n = 1
    while rotated_path(path, n).exists():
        older.append(rotated_path(path, n))
        n += 1
    return [*reversed(older), *([path] if path.exists() else [])]


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Hold the writers off while reading (a shared lock on the lock file), when there is one."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def read_lines(path: Path) -> Iterator[Line]:
    """Every line of the log, oldest first (read while writers are held off)."""
    with reading(path):
        files = log_files(path)
        contents = []
        for file in files:
            with contextlib.suppress(FileNotFoundError):
                contents.append((file, file.read_bytes()))
    for file, data in contents:
        for i, raw in enumerate(data.splitlines(), 1):
            yield Line(file, i, raw, parse_line(raw))


def parse_line(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Verification(NamedTuple):
    lines: int
    files: int
    broken: str | None  # "FILE:LINE: why", the first broken line; None when intact


def verify(path: Path) -> Verification:
    """Check the chain over every kept file. The oldest kept line's ``prev`` is taken as
    given (the lines before it were rotated away)."""
    count = 0
    files: set[Path] = set()
    expected: str | None = None
    before = ""
    for line in read_lines(path):
        count += 1
        files.add(line.file)
        where = f"{line.file}:{line.number}"
        if line.record is None:
            return Verification(count, len(files), f"{where}: not a JSON object (changed or torn)")
        prev = line.record.get("prev")
        if not isinstance(prev, str):
            return Verification(count, len(files), f"{where}: has no `prev` hash")
        if expected is not None and prev != expected:
            return Verification(
                count,
                len(files),
                f"{where}: does not follow the line before it ({before}): that line was "
                "changed, or lines were removed or inserted here",
            )
        expected = line_hash(line.raw)
        before = where
    return Verification(count, len(files), None)
