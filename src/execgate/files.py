"""Creating execgate's own files and folders with explicit modes, whatever the umask.

Everything execgate writes for a user (rules it appends to, caches, logs, the run folder) is
that user's alone: files 0600, folders 0700. The umask can only take bits away, and a permissive
one (``umask 000``) must not make a user's rules world-writable, so modes are set on the open
descriptor (files) or right after creation (folders), never left to the umask.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from execgate.errors import ExecgateError

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def make_private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents as 0700 folders; existing ones are left as
    they are. Returns ``path``."""
    missing: list[Path] = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR)
        except FileExistsError:
            continue  # made by someone else meanwhile: theirs, not ours to chmod
        os.chmod(folder, PRIVATE_DIR)
    return path


def is_own_private_dir(path: Path) -> bool:
    """Whether ``path`` is a folder (not a symlink) of this user that nobody else may enter
    (no group or other bits): one another user made first in a shared place is not."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CLOEXEC)``; a file this call creates is 0600 (an existing
    file keeps its mode)."""
    flags |= os.O_CLOEXEC
    if not flags & os.O_CREAT:
        return os.open(path, flags)
    if flags & os.O_EXCL:
        fd = os.open(path, flags, PRIVATE_FILE)
    else:
        try:  # create it ourselves, to know it is ours to chmod
            fd = os.open(path, flags | os.O_EXCL, PRIVATE_FILE)
        except FileExistsError:
            return os.open(path, flags & ~os.O_CREAT)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomically(path: Path, data: bytes, *, mode: int = PRIVATE_FILE) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``) so a reader sees the old or the new
    file, never a part. The folder must exist."""
    import tempfile  # here: appending to the decision log needs the rest, not this

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ensure_control_dir(folder: Path) -> Path:
    """Create the control folder (0700) if needed; refuse one that is not a directory of ours
    (a symlink, or someone else's folder in ``/tmp``)."""
    try:
        make_private_dir(folder)
        st = os.lstat(folder)
    except OSError as exc:
        raise ExecgateError(f"cannot create the control folder {folder}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ExecgateError(
            f"the control folder {folder} is not a private folder of this user (mode 0700); "
            "remove it"
        )
    return folder
