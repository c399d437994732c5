"""What an exec really runs, as the commands policy must judge.

An exec request names a file. Policy rules name programs. One file answers to several names
(``/usr/bin/rm``, ``/bin/rm`` via a symlinked ``/bin``, ``./rm``, a symlink ``myrm``, a hard link
``gone``), and some execs run another program than the file they name: a ``#!`` script runs its
interpreter, and the dynamic loader (``ld-linux-x86-64.so.2 /usr/bin/rm``) loads its argument
without any further exec the interposer could see. A copy of a rule-named file (``cp
/usr/bin/rm x``, a renamed ``ld.so``) answers to that file's names by its content. This module
turns a request into every command policy must judge; the gate then takes the strictest
decision over all of them.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from execgate.gate.content import NO_CONTENTS, ContentIndex
from execgate.gate.identity import ExecFile, FileId, Interpreter
from execgate.gate.protocol import ExecRequest
from execgate.visible import command_line

# display() of recent short commands: (words, limit) -> line.
_displays: dict[tuple[tuple[str, ...], int], str] = {}
_DISPLAYS_KEPT = 512
# glibc's dynamic loader names (any architecture).
_LOADER = re.compile(r"^ld(-linux)?([-.][\w.-]*)?\.so(\.\d+)*$|^ld\.so$")
# ld.so options that take a value (ld.so --help, glibc 2.36).
_LOADER_VALUE_OPTIONS = {
    "--library-path", "--inhibit-rpath", "--audit", "--preload", "--argv0",
    "--glibc-hwcaps-prepend", "--glibc-hwcaps-mask",
}  # fmt: skip
_LOADER_FLAG_OPTIONS = {
    "--inhibit-cache",
    "--verify",
    "--list",
    "--list-tunables",
    "--list-diagnostics",
}


def is_loader(path: str) -> bool:
    """Whether ``path`` is named like the dynamic loader (a copy is found by content:
    :meth:`GatedExec.runs_loader`)."""
    return bool(_LOADER.match(posixpath.basename(path)))


@dataclass(frozen=True, slots=True)
class GatedExec:
    """One exec request, decoded for policy (paths and argv as ``str`` via ``os.fsdecode``).

    ``path``, ``argv`` and the interpreters' names are what the caller said; ``realpath``,
    ``dev``, ``ino`` and each interpreter's file are what the server read from the descriptors
    that will be executed.
    """

    path: str  # absolute, as the caller named it
    realpath: str  # canonical path of the file that runs, or "" when unknown
    dev: int
    ino: int
    argv: tuple[str, ...]
    cwd: str
    interpreters: tuple[Interpreter, ...]  # the #! chain, outermost first
    pid: int
    ppid: int
    via: str
    leaves_gate: str | None = None  # why the file that runs would leave the gate (set-id, caps)
    # the rule names of the rule-named file whose content the program has (gate/content.py)
    content_names: tuple[str, ...] = ()

    @classmethod
    def from_request(
        cls,
        req: ExecRequest,
        program: ExecFile,
        interpreters: tuple[Interpreter, ...],
        *,
        path: str | None = None,
        cwd: str | None = None,
        pid: int | None = None,
        ppid: int | None = None,
    ) -> GatedExec:
        """The request as the client put it; ``path``, ``cwd``, ``pid`` and ``ppid`` replace
        its claims (see :func:`vouched`)."""
        return cls(
            path=os.fsdecode(req.path) if path is None else path,
            realpath=program.realpath,
            dev=program.dev,
            ino=program.ino,
            argv=tuple(map(os.fsdecode, req.argv)),
            cwd=os.fsdecode(req.cwd) if cwd is None else cwd,
            interpreters=interpreters,
            pid=req.pid if pid is None else pid,
            ppid=req.ppid if ppid is None else ppid,
            via=req.via,
            leaves_gate=runs_file(program, interpreters).leaves_gate,
            content_names=program.content_names,
        )

    @property
    def runs_loader(self) -> bool:
        """Whether the program is the dynamic loader: by its name, or by its content (a
        renamed copy or hard link of ``ld.so``)."""
        return any(map(is_loader, (self.realpath or self.path, *self.content_names)))

    @property
    def file_id(self) -> FileId:
        """The identity of the file that runs (the last interpreter, for a script)."""
        if self.interpreters:
            return self.interpreters[-1].file.id
        return (self.dev, self.ino)

    def exec_argv(self, script: str | None = None) -> list[str]:
        """The argv the file that runs gets: for a script what binfmt_script would build,
        ``[INTERP, (ARG), SCRIPT, ARGV[1:]…]`` nested once per interpreter, ``SCRIPT`` being
        ``script`` (default: the path as the caller named it)."""
        named = script or self.path
        words = [named, *self.argv[1:]] if self.interpreters else list(self.argv)
        for interp in self.interpreters:
            words = [interp.name, *([interp.arg] if interp.arg else []), *words]
        return words

    @property
    def program(self) -> str:
        """The file that was identified and judged."""
        return self.realpath or self.path

    def display(self, limit: int = 300) -> str:
        """The command as the caller wrote it (its ``argv[0]``), for one-line messages."""
        words = (self.argv[0] if self.argv and self.argv[0] else self.path, *self.argv[1:])
        key = (words, limit)
        shown = _displays.get(key)
        if shown is None:
            shown = command_line(words, limit)
            # Loops show the same few commands: keep the short ones (bounded memory).
            if sum(map(len, words)) <= limit:
                if len(_displays) >= _DISPLAYS_KEPT:
                    _displays.clear()
                _displays[key] = shown
        return shown

    def display_judged(self, limit: int = 2000) -> str:
        """The command as policy judged it: the identified program, then the arguments (the
        caller's ``argv[0]`` can be any name: ``exec -a ls /usr/bin/rm``)."""
        return command_line([self.program, *self.argv[1:]], limit)

    def argv0_differs(self) -> bool:
        """Whether the caller's ``argv[0]`` names another program than the one identified."""
        if not self.argv:
            return False
        argv0 = self.argv[0]
        if argv0 in (self.path, self.program):
            return False
        return "/" in argv0 or argv0 not in (
            posixpath.basename(self.path),
            posixpath.basename(self.program),
        )


def vouched(
    req: ExecRequest, program: ExecFile, interpreters: tuple[Interpreter, ...], pid: int
) -> GatedExec:
    """The request with what the client only claimed replaced by what the kernel says: the
    asking process is the socket's peer (``SO_PEERCRED``), its parent and working directory
    come from ``/proc``, and ``path`` counts as a name of the program only while it still
    names the file that was judged (else the file's canonical path stands in: a name that
    points elsewhere could make policy judge another file than the one that runs)."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None  # the process is gone: nothing will run for it anyway
    ppid = parent_pid(pid) or req.ppid
    path = os.fsdecode(req.path)
    if path != program.realpath:  # (the canonical path names the judged file either way)
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) != (program.dev, program.ino):
                path = program.realpath or path
        except (OSError, ValueError):
            path = program.realpath or path
    return GatedExec.from_request(
        req, program, interpreters, path=path, cwd=cwd, pid=pid, ppid=ppid
    )


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` from ``/proc`` (0 if there is no such process); raw
    reads, as this is on every exec request's path."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        stat = os.read(fd, 1024)
    except OSError:
        return 0
    finally:
        os.close(fd)
    # comm is in parentheses and may itself contain ") ": split at the last one.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return 0


def runs_file(program: ExecFile, interpreters: tuple[Interpreter, ...]) -> ExecFile:
    """The file the kernel executes: the program, or for a script (whose own set-id bits the
    kernel ignores) the last of its interpreters."""
    return interpreters[-1].file if interpreters else program


def _names(path: str, realpath: str) -> list[str]:
    """The program tokens policy matches an exec of ``path`` by: the path as executed and the
    canonical path (policy's host-executable resolution then also tries their basenames)."""
    names = [path]
    if realpath and realpath != path:
        names.append(realpath)
    return names


def _loader_target(argv: tuple[str, ...]) -> tuple[str, list[str]] | None:
    """For ``ld.so [options] PROGRAM ARGS…`` return (PROGRAM, ARGS); None for ``ld.so --help``
    and the like, which run no program."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in _LOADER_VALUE_OPTIONS:
            i += 2
            continue
        if arg in _LOADER_FLAG_OPTIONS or arg.startswith("--"):
            i += 1
            continue
        break
    if i >= len(argv):
        return None
    return argv[i], list(argv[i + 1 :])


def _resolve(program: str, cwd: str, search_path: str) -> str:
    if "/" in program:
        return posixpath.normpath(posixpath.join(cwd, program))
    for directory in search_path.split(":"):
        candidate = posixpath.join(directory or ".", program)
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return posixpath.normpath(posixpath.join(cwd, candidate))
    return program


# A command to judge and the identity of the file its program token stands for there (None:
# a file the server cannot pin down, such as the dynamic loader's target, opened by path).
Judged = tuple[list[str], FileId | None]


def _rule_names(
    file_id: FileId, content_names: tuple[str, ...], aliases: Mapping[FileId, tuple[str, ...]]
) -> list[str]:
    """The names rules use for a file: those of its identity (a hard link), then those of the
    rule-named file whose content it has (a copy)."""
    return list(dict.fromkeys((*aliases.get(file_id, ()), *content_names)))


def _loader_target_names(
    path: str, aliases: Mapping[FileId, tuple[str, ...]], contents: ContentIndex
) -> list[str]:
    """The rule names of the file the loader would load from ``path`` (by identity and by
    content). The loader opens it by path itself, so this is a reading, not a pin:
    ``ContentError`` when a file of a rule-named size cannot be compared."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return []
    file_id = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode):  # (the server does not open devices and FIFOs)
        return list(aliases.get(file_id, ()))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:  # the loader cannot read it either
        return list(aliases.get(file_id, ()))
    try:
        st = os.fstat(fd)
        return _rule_names((st.st_dev, st.st_ino), contents.names_of(fd, st), aliases)
    finally:
        os.close(fd)


#: Where a bare program name is looked up when the caller names no search path.
DEFAULT_SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"


def commands_to_judge(
    exec_: GatedExec,
    *,
    aliases: Mapping[FileId, tuple[str, ...]] = {},
    contents: ContentIndex = NO_CONTENTS,
    search_path: str = DEFAULT_SEARCH_PATH,
) -> list[Judged]:
    """Every command whose policy decision applies to this exec, most literal first.

    ``aliases`` maps a file identity ``(dev, ino)`` to the program names rules use for it, so a
    hard link under another name is judged as the program it is; each file's
    ``content_names`` do the same for a copy (its own identity stays the judged file: an
    escalation needs a rule naming the very file). ``contents`` finds the copies among the
    dynamic loader's targets.
    """
    rest = list(exec_.argv[1:])
    program_id = (exec_.dev, exec_.ino)
    commands: list[Judged] = [
        ([name, *rest], program_id) for name in _names(exec_.path, exec_.realpath)
    ]
    commands += [
        ([alias, *rest], program_id)
        for alias in _rule_names(program_id, exec_.content_names, aliases)
    ]
    # What the kernel would run for a script: INTERP [ARG] SCRIPT ARGS…, where INTERP may itself
    # be a script. Each interpreter is judged like a program: by the name in the #! line, by its
    # canonical path and by every rule name of its identity (a symlink or hard link).
    script_command = [exec_.path, *rest]
    for interp in exec_.interpreters:
        tail = [*([interp.arg] if interp.arg else []), *script_command]
        file = interp.file
        names = _names(posixpath.join(exec_.cwd, interp.name), file.realpath)
        names += _rule_names(file.id, file.content_names, aliases)
        if interp.name not in names:
            names.insert(0, interp.name)
        commands += [([name, *tail], file.id) for name in names]
        script_command = [interp.name, *tail]
    if exec_.runs_loader:
        target = _loader_target(exec_.argv)
        if target is not None:
            program, args = target
            resolved = _resolve(program, exec_.cwd, search_path)
            real = os.path.realpath(resolved) if resolved.startswith("/") else ""
            commands.extend(([name, *args], None) for name in _names(resolved, real))
            target_names = _loader_target_names(resolved, aliases, contents)
            commands += [([a, *args], None) for a in target_names]
    return commands


def lookup_folders(path: str, *, max_links: int = 40) -> list[str]:
    """The canonical folders a lookup of the absolute ``path`` reads an entry of, each symlink
    followed as the kernel would: whoever can change an entry in one of them can make
    ``path`` name another file. A missing component ends the walk; so does ``/proc``, listed
    as "" (unknown): its names (``self``, ``fd/N``, ``cwd``) are the looking process's own,
    which only that process resolves (``/dev/fd/N`` leads there too)."""
    folders: dict[str, None] = {}
    current, parts, links = "/", [p for p in path.split("/") if p], 0
    while parts:
        part = parts.pop(0)
        if part in (".", ".."):
            current = posixpath.dirname(current) if part == ".." else current
            continue
        if current == "/proc":
            folders[""] = None
            break
        folders[current] = None
        entry = posixpath.join(current, part)
        try:
            target = os.readlink(entry)
        except OSError:  # not a link (or not there: nothing further is looked up)
            current = entry
            if not os.path.lexists(entry):
                break
            continue
        links += 1
        if links > max_links:  # the kernel gives up (ELOOP): nothing runs from there
            break
        parts[:0] = [p for p in target.split("/") if p]
        current = "/" if target.startswith("/") else current
    return list(folders)


def _leads_to(path: str, dev: int, ino: int) -> bool:
    if not path.startswith("/"):
        return False
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def paths_that_decide(exec_: GatedExec, *, search_path: str = DEFAULT_SEARCH_PATH) -> list[str]:
    """The canonical paths whose writer decides what ``exec_`` runs ("" for a file whose
    path is unknown, or no longer leads to it: a memfd, a deleted file): the program's file
    and each interpreter's, and the folders looked in to find what is opened by name after
    the judgement (the script, which its interpreter reads by the name it was run by; the
    dynamic loader's target, found as :func:`commands_to_judge` found it on ``search_path``)."""
    files = [(exec_.realpath, exec_.dev, exec_.ino)]
    files += [(i.file.realpath, i.file.dev, i.file.ino) for i in exec_.interpreters]
    decided = [real if _leads_to(real, dev, ino) else "" for real, dev, ino in files]
    if exec_.interpreters:
        decided += lookup_folders(exec_.path)
    if exec_.runs_loader:
        target = _loader_target(exec_.argv)
        if target is not None:
            resolved = _resolve(target[0], exec_.cwd, search_path)
            if resolved.startswith("/"):
                decided += [os.path.realpath(resolved), *lookup_folders(resolved)]
            else:
                decided.append("")  # not found here: the loader may find it elsewhere
    return decided


def loader_loads_an_auditor(exec_: GatedExec) -> bool:
    """Whether this exec runs the dynamic loader with ``--audit``: an audit library can skip
    the interposer (``la_objsearch``) in the program the loader then runs."""
    if not exec_.runs_loader:
        return False
    for arg in exec_.argv[1:]:
        if arg == "--audit" or arg.startswith("--audit="):
            return True
        if arg == "--" or not arg.startswith("--"):
            return False
    return False


def parent_chain(pid: int, *, depth: int = 8) -> list[tuple[int, str]]:
    """``[(pid, comm), (ppid, comm), …]`` from ``/proc``, up to ``depth`` processes."""
    chain: list[tuple[int, str]] = []
    while pid > 0 and len(chain) < depth:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            break
        # comm is in parentheses and may itself contain ") ": split at the last one.
        open_paren, close_paren = stat.find(b"("), stat.rfind(b")")
        comm = stat[open_paren + 1 : close_paren].decode(errors="replace")
        chain.append((pid, comm))
        fields = stat[close_paren + 2 :].split()
        pid = int(fields[1]) if len(fields) > 1 else 0
    return chain
