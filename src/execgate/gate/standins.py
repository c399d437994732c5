"""Stand-ins: the kernel exec backstop inside the sandbox (docs/sandbox.md "The exec backstop").

Inside a sandbox every program a rule names is covered, by a read-only bind mount in the
sandbox's mount namespace, with a *stand-in* of this session: a tiny file ``#!WRAPPER --shadow``
of its own inode, kept in the session folder (which no confined process can write). Whatever
executes the program there — the interposer, a raw ``execve``, a static binary, glibc's own
``/bin/sh``, the dynamic loader (which cannot load a ``#!`` file at all) — the kernel starts the
wrapper, which asks the server. Reading the program yields the stand-in, so no copy of the
real file can be made from inside either.

The server trusts no claim about which program a stand-in stands for: a request whose
descriptor is one of the stand-ins it created (by ``(dev, ino)``, a fact the sandbox cannot
forge) is judged as the program the server itself covered with it, opened here, outside the
sandbox. Such a request is never answered ``run`` (the real file is not reachable inside): a
program no rule lets out runs through the launcher, confined in an equivalent sandbox.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from execgate.errors import ExecgateError
from execgate.files import write_atomically
from execgate.gate.identity import SHEBANG_BUFFER, FileId, parse_shebang
from execgate.gate.protocol import MAX_INTERPRETERS
from execgate.gate.snapshot import NOT_LISTED, names_in, program_dirs

# The kernel's binfmt_script reads this much of the first line: the stand-in's `#!` line must fit.
_MAX_SHEBANG = SHEBANG_BUFFER - 2


def rule_named_paths(
    aliases: Mapping[FileId, Sequence[str]],
    host_executables: Mapping[str, Sequence[str]],
    *,
    search_path: str,
) -> list[str]:
    """The canonical paths of every file some rule names (the alias table's files, found where
    the snapshot found them), and of their hard links in the program folders searched."""
    dirs = program_dirs(search_path)
    listed = {d: names_in(d) for d in dirs}  # a stat only where the name is there
    found: dict[str, FileId] = {}
    linked: set[FileId] = set()
    for file_id, names in aliases.items():
        for name in names:
            if "/" in name:
                candidates = [name] if name.startswith("/") else []
            else:
                candidates = [
                    posixpath.join(d, name)
                    for d, there in listed.items()
                    if there is None or name in there or name in NOT_LISTED
                ]
                candidates += list(host_executables.get(name, ()))
            for candidate in candidates:
                try:
                    st = os.stat(candidate)
                except (OSError, ValueError):
                    continue
                if (st.st_dev, st.st_ino) == file_id and not _is_script(candidate):
                    found[os.path.realpath(candidate)] = file_id
                    if st.st_nlink > 1:
                        linked.add(file_id)
    if linked:  # a hard link under another name would run the program unasked
        folders = dict.fromkeys([*dirs, *(posixpath.dirname(p) for p in found)])
        for folder in folders:
            with contextlib.suppress(OSError), os.scandir(folder) as entries:
                for entry in entries:
                    if not any(entry.inode() == ino for _, ino in linked):
                        continue
                    with contextlib.suppress(OSError):
                        st = entry.stat(follow_symlinks=False)
                        if (st.st_dev, st.st_ino) in linked:
                            found.setdefault(os.path.realpath(entry.path), (st.st_dev, st.st_ino))
    return sorted(found)


def _is_script(path: str) -> bool:
    """Whether ``path`` starts with ``#!``. Scripts are not covered: interpreters read them as
    data (``bash build.sh``), and a stand-in would silently give them the wrong text. Their
    execs are judged by the interposer, their interpreters are covered when a rule names them."""
    try:
        with open(path, "rb") as file:
            return file.read(2) == b"#!"
    except OSError:
        return False


class StandIns:
    """The stand-ins of one session: files in ``folder``, and the table the launcher mounts
    them from (``table``: pairs of NUL-terminated paths, stand-in then program)."""

    def __init__(self, folder: Path, wrapper: Path, made: Sequence[str] | None = None) -> None:
        """``made``: the stand-ins are there already, ``folder/0``, ``folder/1``, … for these
        programs, with their table (the native front of ``execgate run`` made them,
        docs/protocol.md §8); each is checked to be one, our own."""
        line = b"#!" + os.fsencode(wrapper) + b" --shadow\n"
        if len(line) > _MAX_SHEBANG or any(c in os.fsencode(wrapper) for c in b" \t\n"):
            raise ExecgateError(
                f"execgate's wrapper {wrapper} cannot be named in a #! line (longer than "
                f"{_MAX_SHEBANG - 12} bytes, or with blanks): the sandbox's exec backstop needs "
                "it; install execgate under a shorter path without spaces"
            )
        self._line = line
        # The `#!` claim of a well-formed request for a stand-in (its interpreter: the wrapper).
        self._claim = (os.fsencode(wrapper), b"--shadow")
        self.folder = folder
        self.table = folder.parent / "standins.table"
        self._by_program: dict[str, Path] = {}
        self._by_id: dict[FileId, str] = {}
        self._marked: set[str] = set()  # programs whose stand-in says standing claims may hold
        if made is not None:
            self._adopt(made)
            return
        folder.mkdir(mode=0o700)
        write_atomically(self.table, b"", mode=0o444)

    def _adopt(self, programs: Sequence[str]) -> None:
        try:
            self._adopt_made(programs)
        except OSError as exc:
            raise ExecgateError(f"the session's stand-ins: {exc}") from None

    def _adopt_made(self, programs: Sequence[str]) -> None:
        for number, program in enumerate(programs):
            standin = self.folder / str(number)
            fd = os.open(standin, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                own = st.st_uid == os.getuid() and stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                if not own or os.pread(fd, len(self._line) + 1, 0) != self._line:
                    raise ExecgateError(f"{standin} is not one of this session's stand-ins")
            finally:
                os.close(fd)
            self._by_program[program] = standin
            self._by_id[(st.st_dev, st.st_ino)] = program
        if self.table.read_bytes() != self._table():
            raise ExecgateError(f"{self.table} is not this session's stand-in table")

    @property
    def programs(self) -> list[str]:
        """The programs covered, in the order they were (their stand-ins' names)."""
        return list(self._by_program)

    def _table(self) -> bytes:
        return b"".join(
            os.fsencode(standin) + b"\0" + os.fsencode(program) + b"\0"
            for program, standin in self._by_program.items()
        )

    def cover(self, programs: Iterable[str]) -> None:
        """Cover ``programs`` (canonical paths) from the next sandboxed spawn on. Stand-ins made
        before stay known: processes spawned earlier still have them mounted."""
        wanted = [p for p in programs if p not in self._by_program]
        if not wanted and self.table.exists():
            return
        for program in wanted:
            standin = self.folder / str(len(self._by_program))
            fd = os.open(standin, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o555)
            try:
                os.write(fd, self._line)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            self._by_program[program] = standin
            self._by_id[(st.st_dev, st.st_ino)] = program
        write_atomically(self.table, self._table(), mode=0o444)

    def program_of(self, fd: int) -> str | None:
        """The program the stand-in behind ``fd`` covers, or None if it is not one of ours."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        return self._by_id.get((st.st_dev, st.st_ino))

    def mark_standing(self, program: str) -> None:
        """Tell interposers that execs of ``program``'s stand-in may be claimed standing
        (docs/protocol.md §4 "Standing claims"): a line after its ``#!`` line makes it larger
        than a bare stand-in. Only a hint (the launcher checks every claim), so that execs of
        other stand-ins never try. Best effort: a stand-in being executed right now
        (``ETXTBSY``) is marked at the next offer."""
        standin = self._by_program.get(program)
        if standin is None or program in self._marked:
            return
        try:
            os.chmod(standin, 0o755)
            try:
                fd = os.open(standin, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                try:
                    os.write(fd, b"# standing\n")
                finally:
                    os.close(fd)
            finally:
                os.chmod(standin, 0o555)
        except OSError:
            return
        self._marked.add(program)

    def covered_by(self, fd: int) -> tuple[FileId, str] | None:
        """The stand-in behind ``fd`` (its identity) and the program it covers, or None when
        it is not one of ours."""
        try:
            st = os.fstat(fd)
        except OSError:
            return None
        program = self._by_id.get((st.st_dev, st.st_ino))
        return None if program is None else ((st.st_dev, st.st_ino), program)

    def substitute(
        self, fds: Sequence[int], claimed: Sequence[tuple[bytes, bytes]], cwd: str
    ) -> tuple[list[int], list[tuple[bytes, bytes]], list[int]] | None:
        """A request's descriptors and ``#!`` claims with the first stand-in among them (the
        program, or an interpreter of a script) replaced by the program it covers and that
        program's own ``#!`` chain, opened here. None when no descriptor is a stand-in. The
        third list holds the descriptors opened here (the caller closes them). OSError when
        the program cannot be opened."""
        for level, fd in enumerate(fds):
            program = self.program_of(fd)
            if program is None:
                continue
            # Only the shapes an exec of a stand-in has: the last descriptor, or the last
            # script run by the wrapper (the last descriptor). Anything else is judged as sent
            # (and refused): extra descriptors are never dropped silently.
            if len(fds) != len(claimed) + 1 or level < len(fds) - 2:
                return None
            if level == len(fds) - 2 and claimed[level] != self._claim:
                return None
            opened = _open_chain(program, cwd, budget=MAX_INTERPRETERS - level)
            chain = [fd for fd, _ in opened]
            lines = [line for _, line in opened if line is not None]
            return [*fds[:level], *chain], [*claimed[:level], *lines], chain
        return None


def _open_chain(
    path: str, cwd: str, *, budget: int
) -> list[tuple[int, tuple[bytes, bytes] | None]]:
    """Open ``path`` and, while it is a script, its interpreters (as the kernel would find
    them): each descriptor with its ``#!`` line (None for the last)."""
    opened: list[tuple[int, tuple[bytes, bytes] | None]] = []
    target = path
    try:
        while True:
            try:
                fd = os.open(posixpath.join(cwd, target), os.O_RDONLY | os.O_CLOEXEC)
            except PermissionError:  # execute-only: still executable by descriptor
                fd = os.open(posixpath.join(cwd, target), os.O_PATH | os.O_CLOEXEC)
            try:
                head = os.pread(fd, SHEBANG_BUFFER, 0)
            except OSError:
                head = b""
            line = parse_shebang(head)
            opened.append((fd, line))
            if line is None:
                return opened
            if len(opened) > budget:
                raise OSError(40, "too many levels of #! interpreters")
            target = os.fsdecode(line[0])
    except BaseException:
        for fd, _ in opened:
            os.close(fd)
        raise
