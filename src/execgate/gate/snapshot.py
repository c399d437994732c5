"""The policy snapshot: which programs the interposer must ask about (docs/protocol.md §6).

Most execs run programs no rule names; their answer is always ``run``. The snapshot lists the
names (as 64-bit FNV-1a hashes) and file identities ``(dev, ino)`` that some rule could match,
so the interposer asks the server only about those, and the sizes of those files, so it also
asks about a program that may be a copy of one (gate/content.py). Building it also yields the
alias table the server uses to judge a hard link under another name as the program it is, and
the content index it uses to judge a copy as the program it copies.
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from execgate.gate.content import ContentIndex, build_index

MAGIC = b"EGSNAP1\0"
ASK_ALWAYS = 1
_HEADER = struct.Struct("<8sIIIIQQQIIQ")
assert _HEADER.size == 64

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1

# Where programs usually live, searched in addition to the session's PATH when looking for the
# files a bare rule name stands for.
STANDARD_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# The dynamic loader runs its argument without an exec the interposer could see: always ask.
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib/ld-linux.so.2")


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


FileId = tuple[int, int]


@dataclass
class Snapshot:
    """What a policy means for the files on this host.

    ``files`` and ``aliases`` are the files some rule names (and the dynamic loader's), by
    identity. ``contents`` indexes those same files by size for content comparison:
    ``contents.by_size`` maps a size to the ``content.RuleFile`` entries (path, ``(dev, ino)``,
    rule names; the loader's under its paths) of that size, ``contents.sizes`` is the
    snapshot's size table, and ``contents.names_of(fd, st)`` gives the rule names of the
    rule-named files whose content the file behind ``fd`` has (SHA-256, computed on demand and
    cached), so a copy under any name or identity is judged as the program it copies. Copies
    themselves are found per exec, never listed here.
    """

    names: set[bytes] = field(default_factory=set)
    files: set[FileId] = field(default_factory=set)
    # (dev, ino) -> the rule names that file answers to
    aliases: dict[FileId, tuple[str, ...]] = field(default_factory=dict)
    # the folders where a change can give a rule-named path another file (to watch)
    folders: set[str] = field(default_factory=set)
    contents: ContentIndex = field(default_factory=ContentIndex)
    # canonical folder -> the (path, identity) pairs found through a link into it
    linked: dict[str, list[tuple[str, FileId]]] = field(default_factory=dict)

    def still_holds(self, folders: Iterable[str]) -> bool:
        """Whether every file found through a link into one of ``folders`` is still the file
        recorded (asked once those folders are watched: a change before that is found here,
        any later one is queued)."""
        return all(
            _stat_id(path) == file_id
            for folder in folders
            for path, file_id in self.linked.get(folder, ())
        )

    def encode(self, *, ask_always: bool = False) -> bytes:
        hashes = sorted({fnv1a64(name) for name in self.names})
        files = sorted(self.files)
        sizes = sorted(self.contents.sizes)
        names_offset = _HEADER.size
        files_offset = names_offset + 8 * len(hashes)
        sizes_offset = files_offset + 16 * len(files)
        header = _HEADER.pack(
            MAGIC,
            ASK_ALWAYS if ask_always else 0,
            len(hashes),
            len(files),
            len(sizes),
            names_offset,
            files_offset,
            sizes_offset,
            0,  # ask folders: none (with_ask_folders)
            0,
            0,
        )
        body = struct.pack(f"<{len(hashes)}Q", *hashes)
        body += b"".join(struct.pack("<QQ", dev, ino) for dev, ino in files)
        body += struct.pack(f"<{len(sizes)}Q", *sizes)
        return header + body


def with_ask_folders(data: bytes, folders: Iterable[str]) -> bytes:
    """The encoded snapshot ``data`` with ask folders: a client asks about every program whose
    canonical path is one of ``folders`` (absolute, canonical) or lies below one. The snapshot
    of escalated programs lists the folders their sandbox can write (protocol §6)."""
    fields = list(_HEADER.unpack_from(data))
    listed = list(dict.fromkeys(os.fsencode(f.rstrip("/") or "/") for f in folders))
    table = b"".join(struct.pack("<I", len(raw)) + raw for raw in listed)
    fields[8], fields[9], fields[10] = len(listed), 0, len(data)
    return _HEADER.pack(*fields) + data[_HEADER.size :] + table


def _stat_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


# Names a folder resolves without listing them (``join(dir, "")`` is the folder itself).
NOT_LISTED = frozenset({"", ".", ".."})


def names_in(folder: str) -> frozenset[str] | None:
    """The entries of ``folder``; empty when it does not exist, None when it cannot be listed
    (searchable but not readable: each name is then looked up on its own)."""
    try:
        return frozenset(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()
    except OSError:
        return None


def program_dirs(search_path: str) -> list[str]:
    """The folders a bare rule name is looked up in: ``search_path``'s, then the standard ones."""
    dirs = list(dict.fromkeys([d for d in search_path.split(":") if d.startswith("/")]))
    return dirs + [d for d in STANDARD_DIRS if d not in dirs]


def folders_to_watch(
    first_tokens: Iterable[str],
    host_executables: dict[str, tuple[str, ...]],
    *,
    search_path: str,
) -> set[str]:
    """The folders :func:`build_snapshot` will look in, known without reading any (watched
    before the build, so it rarely has to be repeated): the program folders, those of the
    paths rules name, and the folders those are links to."""
    folders = set(program_dirs(search_path))
    folders.update(posixpath.dirname(t) for t in first_tokens if "/" in t)
    folders.update(posixpath.dirname(p) for ps in host_executables.values() for p in ps)
    return folders | {os.path.realpath(folder) for folder in folders}


def build_snapshot(
    first_tokens: Iterable[str],
    host_executables: dict[str, tuple[str, ...]],
    *,
    search_path: str,
) -> Snapshot:
    """The snapshot for a policy keyed by ``first_tokens``.

    Bare names are looked up in ``search_path`` and the standard program folders; every file
    found is recorded by identity so hard links and renamed paths still ask.
    """
    snapshot = Snapshot()
    dirs = program_dirs(search_path)
    aliases: dict[FileId, set[str]] = {}
    contents: dict[str, set[str]] = {}  # path -> rule names, for the content index
    real_dirs: dict[str, str] = {}

    def real_dir(path: str) -> str:
        """The canonical folder of ``path`` (one ``lstat`` unless ``path`` is a link: the
        canonical path of a folder is looked up once per build)."""
        folder, name = posixpath.split(path)
        try:
            is_link = stat.S_ISLNK(os.lstat(path).st_mode)
        except (OSError, ValueError):
            is_link = True  # gone since: let realpath say what it is now
        if is_link or name in ("", ".", "..") or not folder.startswith("/"):
            return posixpath.dirname(os.path.realpath(path))
        real = real_dirs.get(folder)
        if real is None:
            real = real_dirs[folder] = os.path.realpath(folder)
        return real

    def record(path: str, name: str) -> None:
        snapshot.folders.add(posixpath.dirname(path))
        file_id = _stat_id(path)
        if file_id is not None:
            real = real_dir(path)
            snapshot.folders.add(real)
            if real != posixpath.dirname(path):
                snapshot.linked.setdefault(real, []).append((path, file_id))
            snapshot.files.add(file_id)
            aliases.setdefault(file_id, set()).add(name)
            contents.setdefault(path, set()).add(name)

    bare: list[str] = []
    for token in first_tokens:
        snapshot.names.add(os.fsencode(token))
        if "/" in token:
            record(token, token)
        else:
            bare.append(token)
    for directory in dirs:
        # A folder's names are read once (not a stat per rule name and folder: with thousands
        # of rules that was most of a start-up); the names listed there are then stat-ed.
        snapshot.folders.add(directory)
        listed = names_in(directory)
        for token in bare:
            if listed is None or token in listed or token in NOT_LISTED:
                record(posixpath.join(directory, token), token)
    for name, paths in host_executables.items():
        snapshot.names.add(os.fsencode(name))
        for path in paths:
            snapshot.names.add(os.fsencode(path))
            record(path, name)
    for loader in LOADERS:
        real = os.path.realpath(loader)
        if os.path.exists(real):
            for path in (loader, real):
                snapshot.names.add(os.fsencode(path))
                snapshot.names.add(os.fsencode(posixpath.basename(path)))
            file_id = _stat_id(real)
            if file_id is not None:
                snapshot.files.add(file_id)
                # a copy of the loader is a loader (program.is_loader reads these names)
                contents.setdefault(real, set()).update((loader, real))
    snapshot.aliases = {k: tuple(sorted(v)) for k, v in aliases.items()}
    snapshot.contents = build_index((path, tuple(n)) for path, n in contents.items())
    return snapshot


class SealedSnapshot:
    """The snapshot for sessions without a sandbox, where a gated process (same user) could
    replace any file of the session folder: a memfd sealed against every change, always at the
    same descriptor number of this process. Clients open it as ``/proc/<server pid>/fd/<n>``
    (``EXECGATE_SNAPSHOT``, protocol §6); a policy change puts a new memfd at that number with
    ``dup2``, which is atomic. Inside a Landlock sandbox ``/proc/<server>/fd`` is out of reach,
    so sandboxed sessions use the file (read-only there)."""

    _SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    _LOWEST_FD = 100  # out of the way of descriptors that are passed on by number

    def __init__(self, data: bytes) -> None:
        sealed = _sealed_memfd(data)
        try:
            self.fd = fcntl.fcntl(sealed, fcntl.F_DUPFD_CLOEXEC, self._LOWEST_FD)
        finally:
            os.close(sealed)
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"

    @classmethod
    def adopt(cls, fd: int) -> SealedSnapshot:
        """The sealed snapshot the native front made, inherited at ``fd`` (docs/protocol.md
        §8): clients already name it ``/proc/<this pid>/fd/<fd>``."""
        os.set_inheritable(fd, False)
        adopted = cls.__new__(cls)
        adopted.fd = fd
        adopted.path = f"/proc/{os.getpid()}/fd/{fd}"
        return adopted

    def contents(self) -> bytes:
        """The snapshot as published (what clients read)."""
        return os.pread(self.fd, os.fstat(self.fd).st_size, 0)

    def publish(self, data: bytes) -> None:
        sealed = _sealed_memfd(data)
        try:
            os.dup2(sealed, self.fd, inheritable=False)
        finally:
            os.close(sealed)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _sealed_memfd(data: bytes) -> int:
    fd = os.memfd_create("execgate-policy.snap", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SealedSnapshot._SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd
