"""Where execgate keeps its files. Every location can be moved by an environment variable so
tests (and users with unusual setups) never touch the real ones -- except the admin's folders,
which only root can move: they hold the requirements that bind ordinary users."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
from pathlib import Path

# The identity map of the initial user namespace: root here is the machine's root, not the
# root of a user namespace any user can create.
_INITIAL_UID_MAP = ["0", "0", "4294967295"]


@functools.cache
def is_machine_root() -> bool:
    """Whether we run as root of the initial user namespace."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map", encoding="ascii") as uid_map:
            return uid_map.read().split() == _INITIAL_UID_MAP
    except OSError:
        return False


def _admin_dir(variable: str, default: str) -> Path:
    """An admin folder: ``default``, or ``$variable`` when root set it (an ordinary user's
    setting is ignored, so it cannot trade the admin's requirements for its own)."""
    value = os.environ.get(variable)
    return Path(value) if value and is_machine_root() else Path(default)


def execgate_home() -> Path:
    """User-level state and config: ``$EXECGATE_HOME``, default ``~/.execgate``."""
    value = os.environ.get("EXECGATE_HOME")
    return Path(value) if value else Path.home() / ".execgate"


def system_dir() -> Path:
    """System (admin) layer: ``/etc/execgate`` (root may move it: ``$EXECGATE_SYSTEM_DIR``)."""
    return _admin_dir("EXECGATE_SYSTEM_DIR", "/etc/execgate")


def codex_home() -> Path:
    """Codex's user folder: ``$CODEX_HOME``, default ``~/.codex``."""
    value = os.environ.get("CODEX_HOME")
    return Path(value) if value else Path.home() / ".codex"


def codex_system_dir() -> Path:
    """Codex's system folder: ``/etc/codex`` (root may move it: ``$EXECGATE_CODEX_SYSTEM_DIR``)."""
    return _admin_dir("EXECGATE_CODEX_SYSTEM_DIR", "/etc/codex")


def config_file() -> Path:
    return execgate_home() / "config.toml"


def user_rules_dir() -> Path:
    return execgate_home() / "rules"


def user_default_rules_file() -> Path:
    """Where ``execgate rules init`` and "always allow" answers write."""
    return user_rules_dir() / "default.rules"


def cache_dir() -> Path:
    return execgate_home() / "cache"


def log_dir() -> Path:
    """The decision log and the escalations log: ``$EXECGATE_HOME/log`` when that variable is
    set, else the XDG state folder (``$XDG_STATE_HOME/execgate``, default
    ``~/.local/state/execgate``) -- or, when that folder cannot be created (a read-only home),
    a private folder named after it under ``$XDG_RUNTIME_DIR`` (else ``/tmp``)."""
    wanted = wanted_log_dir()
    return _log_dir(str(wanted), os.environ.get("XDG_RUNTIME_DIR"))


def wanted_log_dir() -> Path:
    """Where the logs go when that folder can be written (see :func:`log_dir`)."""
    if os.environ.get("EXECGATE_HOME"):
        return execgate_home() / "log"
    return _xdg_state_home() / "execgate"


def log_dir_moved() -> str | None:
    """A sentence saying where the logs went instead, when :func:`wanted_log_dir` could not be
    used; ``None`` when it is used."""
    used, wanted = log_dir(), wanted_log_dir()
    return None if used == wanted else f"{wanted} cannot be written; the logs are in {used}"


@functools.cache  # one answer per process: the folder written is the one sandboxes protect
def _log_dir(wanted: str, runtime: str | None) -> Path:
    if not _read_only_above(Path(wanted)):  # usable, or broken: then its error is the answer
        return Path(wanted)
    digest = hashlib.sha256(os.fsencode(wanted)).hexdigest()[:16]
    return _private_fallback(f"execgate-log-{os.getuid()}-{digest}", runtime) or Path(wanted)


def _read_only_above(folder: Path) -> bool:
    """Whether ``folder`` is missing and cannot be made only because the nearest existing
    folder above it is not writable for this user (a read-only home)."""
    for existing in folder.parents:
        if existing.is_dir():
            return not folder.exists() and not os.access(existing, os.W_OK | os.X_OK)
        if os.path.lexists(existing):
            return False
    return False


def _private_fallback(name: str, runtime: str | None) -> Path | None:
    """``name`` under ``$XDG_RUNTIME_DIR`` (else ``/tmp``), made now if missing, and used only
    if it is this user's own 0700 folder (no one else can then add, remove or swap files in
    it); ``None`` when neither is."""
    bases = [Path(runtime)] if runtime and os.path.isabs(runtime) else []
    for folder in (base / name for base in [*bases, Path("/tmp")]):
        with contextlib.suppress(OSError):  # made by us now, or there already: checked next
            os.mkdir(folder, 0o700)
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
            return folder
    return None


def _xdg_state_home() -> Path:
    value = os.environ.get("XDG_STATE_HOME")
    return Path(value) if value and os.path.isabs(value) else Path.home() / ".local" / "state"


def decision_log_file() -> Path:
    """The user's decision log (every session appends to it): ``log_dir()/decisions.jsonl``."""
    return log_dir() / "decisions.jsonl"


#: The longest file name a control channel puts in :func:`control_dir` (``mcp-<pid>.sock``).
_CONTROL_NAME_MAX = len("mcp-4194304.sock")
_SUN_PATH_MAX = 100  # bytes; the kernel's limit is 108 including the NUL


def control_dir() -> Path:
    """Where running servers keep their control sockets and the files that describe them
    (``execgate approvals`` finds servers there). Every sandbox hides this folder, so it is
    kept apart from the session folders: ``$EXECGATE_HOME/control``, or, when a socket path
    there would not fit in a socket address or that folder cannot be created (a read-only
    home), a folder named after ``$EXECGATE_HOME`` under ``$XDG_RUNTIME_DIR`` (else ``/tmp``)."""
    return _control_dir(os.path.abspath(execgate_home()), os.environ.get("XDG_RUNTIME_DIR"))


@functools.cache  # one answer per process: the folder a server uses is the one sandboxes hide
def _control_dir(home: str, runtime: str | None) -> Path:
    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    name = f"execgate-control-{os.getuid()}-{digest}"
    candidates = [Path(home) / "control"]
    if runtime and os.path.isabs(runtime):
        candidates.append(Path(runtime) / name)
    for folder in candidates:
        if len(os.fsencode(folder)) + 1 + _CONTROL_NAME_MAX < _SUN_PATH_MAX and _can_hold(folder):
            return folder
    return Path("/tmp") / name


def _can_hold(folder: Path) -> bool:
    """Whether ``folder`` exists or this user can create it (its nearest existing ancestor is
    writable)."""
    for existing in (folder, *folder.parents):
        if existing.is_dir():
            return existing == folder or os.access(existing, os.W_OK | os.X_OK)
        if os.path.lexists(existing):
            return False
    return False


def state_paths() -> list[Path]:
    """Everything that decides what a session may do, or records it: execgate's home (rules,
    ``config.toml``, trusted projects, caches, approvals, control sockets), its logs (also the
    default XDG state folder), the system
    folders of execgate and Codex (rules, admin requirements), and Codex's user rules folders,
    also the default ones when variables move them (a later run may not set the variables).
    No gated process may write any of them."""
    return [
        execgate_home(),
        Path.home() / ".execgate",
        log_dir(),
        Path.home() / ".local" / "state" / "execgate",
        system_dir(),
        codex_system_dir(),
        codex_home() / "rules",
        Path.home() / ".codex" / "rules",
    ]


#: Files this process records decisions in besides the log (``--audit FILE``).
_record_files: list[Path] = []


def add_record_file(path: Path) -> None:
    """``path`` records this process's decisions (``--audit``): every sandbox it starts keeps
    it read-only, as it keeps the log (a gated process must not rewrite its own record)."""
    real = Path(os.path.realpath(path))
    if real not in _record_files:
        _record_files.append(real)


def record_files() -> list[Path]:
    """The files given to :func:`add_record_file`."""
    return list(_record_files)


def session_folders() -> list[Path]:
    """Where the folders of sessions (gate socket, policy snapshot, stand-ins) are made, best
    first: ``execgate-sessions-UID`` under ``$XDG_RUNTIME_DIR`` and ``/dev/shm``,
    ``$EXECGATE_HOME/run``, ``execgate-sessions-UID`` under ``/tmp``. Every sandbox keeps them
    all read-only (the first and last through :func:`shared_session_folders`, the other as
    part of ``$EXECGATE_HOME``), so no confined process can reach into another session's
    folder (``/dev/shm`` and ``/tmp`` are writable roots)."""
    *first, last = shared_session_folders()
    return [*first, execgate_home() / "run", last]


def shared_session_folders() -> list[Path]:
    """The session folders of :func:`session_folders` that are not in ``$EXECGATE_HOME``
    (``/tmp`` last)."""
    name = f"execgate-sessions-{os.getuid()}"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    found = [Path(runtime) / name] if runtime and os.path.isabs(runtime) else []
    return [*found, Path("/dev/shm") / name, Path("/tmp") / name]
