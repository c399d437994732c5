"""Where the compiled native programs live inside the installed package, and the check that
they are still the ones that were installed (``_bin/manifest.json``, written by the build)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from pathlib import Path

from execgate.errors import ExecgateError

INTERPOSER = "libexecgate.so"
WRAPPER = "execgate-wrapper"
LAUNCHER = "execgate-launch"
#: ``{"sha256": {name: hex digest}}`` for every native file (native/build.py writes it).
MANIFEST = "manifest.json"

_REINSTALL = "reinstall the package (pip install .) so the build compiles native/"

#: (path, dev, ino, size, mtime_ns, ctime_ns): a file that is replaced or written to changes
#: one of them (ctime cannot be set back).
FileKey = tuple[str, int, int, int, int, int]
#: The names :func:`verify_installation` checks, the manifest first.
_CHECKED = (MANIFEST, INTERPOSER, WRAPPER, LAUNCHER)
# SHA-256 of native files by identity: a file not changed since is not read again.
_digests: dict[FileKey, str] = {}
# The identities of _CHECKED when they were found to agree: as long as they are the same,
# the installation is what was checked.
_intact: set[tuple[FileKey | None, ...]] = set()


def _key(path: Path, st: os.stat_result) -> FileKey:
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@functools.cache
def bin_dir() -> Path:
    """The package's ``_bin`` folder (canonical; found once: resolving a path costs a stat of
    every folder on the way, and every session asks)."""
    # The package is installed as files (the native programs must be): no resource reader
    # needed (importing one costs a start-up several milliseconds).
    return (Path(__file__).parent / "_bin").resolve()


def native_path(name: str) -> Path:
    """Absolute path of a native program shipped in the package (``execgate/_bin``). Not
    resolved again: :func:`verify_installation` refuses a native file that is a symlink."""
    path = bin_dir() / name
    if not path.exists():
        raise ExecgateError(f"execgate's native program {name} is missing at {path}; {_REINSTALL}")
    return path


def _digest_of(path: Path) -> tuple[str, FileKey]:
    """SHA-256 of the regular file at ``path`` (not following a final symlink), and its
    identity; ExecgateError when it cannot be read or is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ExecgateError(f"cannot read execgate's native file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ExecgateError(f"execgate's native file {path} is not a regular file")
        key = _key(path, st)
        if key not in _digests:
            digest = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
            _digests[key] = digest.hexdigest()
        return _digests[key], key
    except OSError as exc:
        raise ExecgateError(f"cannot read execgate's native file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _as_found(path: Path) -> FileKey | None:
    """The identity of the regular file at ``path`` (a final symlink is not followed), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return _key(path, st) if stat.S_ISREG(st.st_mode) else None


def verify_installation() -> None:
    """Check that every native file is readable, regular and has the digest recorded when the
    package was built; raise a one-line :class:`ExecgateError` otherwise. A session must not
    load an interposer, wrapper or launcher that is not what was installed."""
    folder = bin_dir()
    # Every session asks: when the manifest and the files are the ones this process found to
    # agree, four stats say so (no file opened, no JSON read).
    if tuple(_as_found(folder / name) for name in _CHECKED) in _intact:
        return
    manifest = folder / MANIFEST
    try:
        manifest_text, manifest_key = _read_regular(manifest)
        recorded = json.loads(manifest_text)["sha256"]
        if not isinstance(recorded, dict) or not recorded:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise ExecgateError(
            f"execgate's native manifest {manifest} is unreadable; {_REINSTALL}"
        ) from None
    keys: list[FileKey | None] = [manifest_key]
    for name in _CHECKED[1:]:
        expected = recorded.get(name)
        if not isinstance(expected, str):
            raise ExecgateError(f"execgate's native manifest does not list {name}; {_REINSTALL}")
        digest, key = _digest_of(folder / name)
        if digest != expected:
            raise ExecgateError(
                f"execgate's native file {folder / name} is not the one that was installed "
                f"(its SHA-256 differs from {manifest.name}); {_REINSTALL}"
            )
        keys.append(key)
    _intact.add(tuple(keys))


def _read_regular(path: Path) -> tuple[str, FileKey]:
    """The text of the regular file at ``path`` (a final symlink is not followed) and the
    identity of what was read; OSError or ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        text = f.read().decode("utf-8")
    return text, _key(path, st)
