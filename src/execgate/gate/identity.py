"""Which files an exec really runs, derived by the server itself (docs/protocol.md §3).

A gated process is an attacker: the names it sends (PATH, argv[0], the ``#!`` names) are only
claims, which may add rule matches but never decide what runs. What runs is the descriptors it
attached to its request: the program, then for a ``#!`` script each interpreter in turn. This
module checks those descriptors and reads everything policy needs from them: the canonical path
(the ``/proc/self/fd`` link), the identity ``(dev, ino)`` and the ``#!`` line, from the very
file that will be executed, and, for a file of a rule-named file's size, which rule-named
program it is a copy of (gate/content.py). It also says which files a rule's program token
names, so an escalation happens only when the rule names the file that runs.
"""

from __future__ import annotations

import errno
import grp
import itertools
import os
import posixpath
import pwd
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from execgate.gate.content import NO_CONTENTS, ContentError, ContentIndex
from execgate.gate.protocol import MAX_INTERPRETERS, JudgedFile
from execgate.policy.evaluate import resolve_program_path

FileId = tuple[int, int]

# The host's trusted program folders: a bare rule name stands for the first file found here.
TRUSTED_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# The kernel's binfmt_script buffer.
SHEBANG_BUFFER = 256


class IdentityError(Exception):
    """The descriptors of a request are not what an exec of a program needs (deny it)."""


@dataclass(frozen=True, slots=True)
class ExecFile:
    """One file that will be executed, as the server sees it through its descriptor."""

    realpath: str  # canonical path ("" if the descriptor's link cannot be read)
    dev: int
    ino: int
    shebang: tuple[str, str] | None  # (interpreter, argument) when the file is a #! script
    leaves_gate: str | None = None  # why running it would leave the gate (set-id, capabilities)
    # the rule names of the rule-named file(s) whose content it has (itself included)
    content_names: tuple[str, ...] = ()
    # what fstat said before anything was read from it (a standing authorization holds
    # while the file still says so, docs/protocol.md §7 `standing`)
    judged: JudgedFile | None = None

    @property
    def id(self) -> FileId:
        return (self.dev, self.ino)


@dataclass(frozen=True, slots=True)
class Interpreter:
    """One level of ``#!``: the name as the script's first line gives it, its optional
    argument, and the file the client opened for it (which is what runs)."""

    name: str
    arg: str
    file: ExecFile


def parse_shebang(head: bytes) -> tuple[bytes, bytes] | None:
    """The kernel's binfmt_script parser (fs/binfmt_script.c), byte for byte the same as the
    client's: ``(interpreter, argument)`` from the first 256 bytes, or None (not a script)."""
    if not head.startswith(b"#!"):
        return None
    buf = head[:SHEBANG_BUFFER].ljust(SHEBANG_BUFFER, b"\0")
    blank = b" \t"
    end = SHEBANG_BUFFER - 1
    i_end = buf.find(b"\n")
    if i_end < 0:
        q = 2
        while q < end and buf[q] in blank:
            q += 1
        if q >= end:
            return None
        t = q
        while t < end and buf[t] not in b" \t\0":
            t += 1
        if t >= end:
            return None  # the interpreter's path is truncated
        i_end = end
    while i_end > 2 and buf[i_end - 1] in blank:
        i_end -= 1
    i_name = 2
    while i_name < i_end and buf[i_name] in blank:
        i_name += 1
    if i_name >= i_end:
        return None
    i_sep = i_name
    while i_sep < i_end and buf[i_sep] not in b" \t\0":
        i_sep += 1
    arg = b""
    if i_sep < i_end and buf[i_sep] != 0:
        i_arg = i_sep
        while i_arg < i_end and buf[i_arg] in blank:
            i_arg += 1
        if i_arg < i_end:
            arg = buf[i_arg:i_end].split(b"\0", 1)[0]
    return buf[i_name:i_sep], arg


def _read_head(fd: int) -> bytes | None:
    """The first bytes of the file behind ``fd``; None when it cannot be read (an ``O_PATH``
    descriptor of an execute-only file: no interpreter could read it either)."""
    try:
        return os.pread(fd, SHEBANG_BUFFER, 0)
    except OSError:
        pass
    try:  # O_PATH: open the very same file again through its descriptor
        again = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        before, after = os.fstat(fd), os.fstat(again)
        if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
            return None
        return os.pread(again, SHEBANG_BUFFER, 0)
    except OSError:
        return None
    finally:
        os.close(again)


def exec_file(fd: int, contents: ContentIndex = NO_CONTENTS) -> ExecFile:
    """Inspect one descriptor a client attached; :class:`IdentityError` unless it is an
    executable regular file whose content ``contents`` can tell apart."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise IdentityError(f"bad program descriptor ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError("the program descriptor is not a regular file")
    if not st.st_mode & 0o111:
        raise IdentityError("the program descriptor is not executable")
    try:
        realpath = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        realpath = ""
    head = _read_head(fd)
    parsed = parse_shebang(head) if head is not None else None
    shebang = None if parsed is None else (os.fsdecode(parsed[0]), os.fsdecode(parsed[1]))
    try:
        content_names = contents.names_of(fd, st)
    except ContentError as exc:
        raise IdentityError(
            f"the program cannot be told from a program rules name: {exc}"
        ) from None
    return ExecFile(
        realpath=realpath,
        dev=st.st_dev,
        ino=st.st_ino,
        shebang=shebang,
        leaves_gate=_why_it_leaves_the_gate(fd, st),
        content_names=content_names,
        judged=JudgedFile.of(st),
    )


def _owner(st: os.stat_result, *, group: bool) -> str:
    try:
        return grp.getgrgid(st.st_gid).gr_name if group else pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_gid if group else st.st_uid)


def _why_it_leaves_the_gate(fd: int, st: os.stat_result) -> str | None:
    """Why executing the file behind ``fd`` would leave the exec gate, or None.

    The kernel runs set-uid, set-gid and file-capability programs in secure mode: the loader
    drops ``LD_PRELOAD``, so nothing such a program starts is gated (unless no-new-privs makes
    the kernel ignore the bits, as every sandbox does). Read from the descriptor that will be
    executed, never from a path.
    """
    if st.st_mode & stat.S_ISUID:
        return f"a set-uid program (runs as {_owner(st, group=False)})"
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IXGRP:
        return f"a set-gid program (runs with group {_owner(st, group=True)})"
    try:
        try:
            os.getxattr(fd, "security.capability")
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise
            # An O_PATH descriptor has no xattr calls: read them through its /proc link.
            os.getxattr(f"/proc/self/fd/{fd}", "security.capability")
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP):
            return f"its file capabilities cannot be read ({exc.strerror})"
        return None
    return "a program with file capabilities"


def inspect_descriptors(
    fds: Sequence[int],
    claimed: Sequence[tuple[bytes, bytes]],
    contents: ContentIndex = NO_CONTENTS,
) -> tuple[ExecFile, tuple[Interpreter, ...]]:
    """The program and its interpreter chain from the request's descriptors.

    ``fds`` are the program, then one interpreter per ``#!`` level; ``claimed`` the client's
    reading of each ``#!`` line, which must equal ours (read from the same descriptors): the
    client builds the argv it executes from its reading, so both must have judged the same
    text. A script rewritten in between is refused, never guessed at.
    """
    if not fds:
        raise IdentityError("the request carries no program descriptor")
    if len(fds) != len(claimed) + 1:
        raise IdentityError("the request's descriptors do not match its interpreters")
    files = [exec_file(fd, contents) for fd in fds]
    interpreters: list[Interpreter] = []
    for level, (script, file) in enumerate(itertools.pairwise(files)):
        name, arg = claimed[level]
        if script.shebang != (os.fsdecode(name), os.fsdecode(arg)):
            raise IdentityError("the script changed while it was being checked")
        interpreters.append(Interpreter(script.shebang[0], script.shebang[1], file))
    if files[-1].shebang is not None:
        if len(interpreters) >= MAX_INTERPRETERS:
            raise IdentityError("too many levels of #! interpreters")
        raise IdentityError("the script changed while it was being checked")
    return files[0], tuple(interpreters)


def files_named_by(
    token: str, *, cwd: str, host_executables: Mapping[str, Sequence[str]]
) -> set[FileId]:
    """The files a rule's program token stands for: a path token the file it resolves to
    (against ``cwd``); a bare name its ``host_executable`` paths, or else the first match on
    the trusted PATH."""
    paths: Sequence[str]
    if "/" in token:
        paths = [resolve_program_path(token, cwd)]
    elif token in host_executables:
        paths = host_executables[token]
    else:
        paths = []
        for directory in TRUSTED_PATH:
            candidate = posixpath.join(directory, token)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                paths = [candidate]
                break
    found: set[FileId] = set()
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            continue
        found.add((st.st_dev, st.st_ino))
    return found


@dataclass(frozen=True)
class OpenedPath:
    """A program opened by the server itself, with its ``#!`` chain: ``fds`` are the program,
    then each interpreter (``O_PATH``, close-on-exec), the caller's to close."""

    file: ExecFile
    interpreters: tuple[Interpreter, ...]
    fds: tuple[int, ...]


def open_path(path: str, cwd: str, contents: ContentIndex = NO_CONTENTS) -> OpenedPath:
    """The program at ``path`` and its ``#!`` chain, opened by the server itself (for the
    session's own command, which execgate starts: it runs the last descriptor, the file that
    was judged). OSError when a file cannot be opened."""
    files: list[ExecFile] = []
    fds: list[int] = []
    names: list[tuple[str, str]] = []
    target = path
    try:
        while True:
            fd = os.open(posixpath.join(cwd, target), os.O_PATH | os.O_CLOEXEC)
            fds.append(fd)
            try:
                file = exec_file(fd, contents)
            except IdentityError as exc:
                raise OSError(13, f"Permission denied ({exc})") from None
            files.append(file)
            if file.shebang is None:
                break
            if len(names) >= MAX_INTERPRETERS:
                raise OSError(40, "too many levels of #! interpreters")
            names.append(file.shebang)
            target = file.shebang[0]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    chain = tuple(Interpreter(n, a, f) for (n, a), f in zip(names, files[1:], strict=True))
    return OpenedPath(files[0], chain, tuple(fds))
