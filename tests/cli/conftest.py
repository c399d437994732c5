"""Fixtures for the command-line tests (helpers: cliharness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliharness import World


@pytest.fixture
def world(tmp_path: Path) -> World:
    names = ["home", "execgate_home", "codex_home", "work"]
    dirs = {name: tmp_path / name for name in names}
    for directory in dirs.values():
        directory.mkdir()
    return World(**dirs)
