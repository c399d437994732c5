"""Where execgate keeps its files. Every location can be moved by an environment variable so
tests (and users with unusual setups) never touch the real ones."""

from __future__ import annotations

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
