"""Where execgate keeps its files. Every location can be moved by an environment variable so
tests (and users with unusual setups) never touch the real ones."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def execgate_home() -> Path:
    """User-level state and config: ``$EXECGATE_HOME``, default ``~/.execgate``."""
    value = os.environ.get("EXECGATE_HOME")
    return Path(value) if value else Path.home() / ".execgate"


def system_dir() -> Path:
    """System (admin) layer: ``$EXECGATE_SYSTEM_DIR``, default ``/etc/execgate``."""
    return Path(os.environ.get("EXECGATE_SYSTEM_DIR", "/etc/execgate"))


def codex_home() -> Path:
    """Codex's user folder: ``$CODEX_HOME``, default ``~/.codex``."""
    value = os.environ.get("CODEX_HOME")
    return Path(value) if value else Path.home() / ".codex"


def codex_system_dir() -> Path:
    """Codex's system folder: ``$EXECGATE_CODEX_SYSTEM_DIR``, default ``/etc/codex``."""
    return Path(os.environ.get("EXECGATE_CODEX_SYSTEM_DIR", "/etc/codex"))


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
    return execgate_home() / "log"


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
    ``config.toml``, trusted projects, caches, logs, approvals, control sockets), the system
    folders of execgate and Codex (rules, admin requirements), and Codex's user rules folders,
    also the default ones when variables move them (a later run may not set the variables).
    No gated process may write any of them."""
    return [
        execgate_home(),
        Path.home() / ".execgate",
        system_dir(),
        codex_system_dir(),
        codex_home() / "rules",
        Path.home() / ".codex" / "rules",
    ]
