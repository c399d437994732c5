"""Where execgate keeps its files. Every location can be moved by an environment variable so
tests (and users with unusual setups) never touch the real ones -- except the admin's folders,
which only root can move: they hold the requirements that bind ordinary users."""

from __future__ import annotations

import functools
import hashlib
import os
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
    ``~/.local/state/execgate``)."""
    if os.environ.get("EXECGATE_HOME"):
        return execgate_home() / "log"
    return _xdg_state_home() / "execgate"


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
    there would not fit in a socket address, a folder named after ``$EXECGATE_HOME`` under
    ``$XDG_RUNTIME_DIR`` (else ``/tmp``)."""
    home = hashlib.sha256(os.fsencode(os.path.abspath(execgate_home()))).hexdigest()[:16]
    name = f"execgate-control-{os.getuid()}-{home}"
    candidates = [execgate_home() / "control"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        candidates.append(Path(runtime) / name)
    for folder in candidates:
        if len(os.fsencode(folder)) + 1 + _CONTROL_NAME_MAX < _SUN_PATH_MAX:
            return folder
    return Path("/tmp") / name


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
