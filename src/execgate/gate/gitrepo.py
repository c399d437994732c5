"""Whether an escalation would start in a git repository its sandbox can write.

An escalated ``git`` runs the hooks and config of the repository it starts in
(``core.fsmonitor``, ``core.pager``, filters, hooks): code. ``<root>/.git`` is a read-only
carve-out when it exists at the spawn, but a sandbox can make a repository of its own (a nested
one, or ``.git`` in a root after the spawn), and any escalated program may run ``git`` there
(its own execs run outside the sandbox). So an escalation out of a sandbox that could write the
repository of its working directory runs in place instead (docs/sandbox.md).

The check looks through the asking process's own root (``/proc/PID/root``), so it sees the
mounts of that process's sandbox: what is on a writable mount there, the sandbox wrote or can.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection

#: Parent folders looked at, at most (git's own discovery stops at the file system root).
_MAX_DEPTH = 256


def sandbox_writable_repository(
    pid: int, cwd: str, known: Collection[tuple[int, int]] | None = None
) -> str | None:
    """The ``.git`` (as the process sees it) of the repository a program started in ``cwd``
    by process ``pid`` would use — or the folder itself, when git would take it for a
    repository — when that process's sandbox can write it or the folder it points to; None
    when there is none or it is read-only there. A ``.git`` that cannot be examined counts as
    writable (fail closed). ``known``: the (dev, ino) of the protected names that existed
    when the front end started (``SandboxSpec.known_carveouts``); a read-only ``.git`` in a
    folder the sandbox can write that is not one of them was made by a sandbox (one that
    could write it, before the spawn that protected it) and counts as writable. The launcher
    looks again when the program starts (a repository made after this look is refused there)
    and pins what git may use (native/gitrepo.h)."""
    root = f"/proc/{pid}/root"
    folder = posixpath.normpath(cwd) if posixpath.isabs(cwd) else "/"
    for _ in range(_MAX_DEPTH):
        dot_git = posixpath.join(folder, ".git")
        seen = root + dot_git
        if os.path.lexists(seen):
            places = [seen]
            if os.path.isfile(seen):  # a gitfile: "gitdir: PATH" (a worktree, a submodule)
                target = _gitfile_target(seen)
                if target is None:
                    return dot_git
                places.append(root + posixpath.normpath(posixpath.join(folder, target)))
            if any(_writable_mount(p) for p in places):
                return dot_git
            made_since = known is not None and _identity(seen) not in known
            if made_since and _writable_mount(root + folder):
                return dot_git  # a carve-out of a .git that was not there at the start
            return None
        # git also takes the folder itself for a repository (a bare one, or one whose config
        # names a work tree): HEAD, objects, refs are all it needs, and the sandbox can put them
        # into any folder it can write
        if _repository_folder(root + folder) and _writable_mount(root + folder):
            return folder
        if folder == "/":
            return None
        folder = posixpath.dirname(folder)
    return None


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _repository_folder(path: str) -> bool:
    """Looks like a git directory (looser than git's own test, never stricter)."""
    return os.path.lexists(posixpath.join(path, "HEAD")) and any(
        os.path.lexists(posixpath.join(path, name)) for name in ("objects", "commondir")
    )


def _gitfile_target(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    first = text.splitlines()[0] if text else ""
    return first[len("gitdir:") :].strip() or None if first.startswith("gitdir:") else None


def _writable_mount(path: str) -> bool:
    try:
        return not os.statvfs(path).f_flag & os.ST_RDONLY
    except OSError:
        return True
