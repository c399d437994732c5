"""Where execgate keeps its files. Every location can be moved by an environment variable so
tests (and users with unusual setups) never touch the real ones -- except the admin's folders,
which only root can move: they hold the requirements that bind ordinary users."""

from __future__ import annotations

import functools
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
