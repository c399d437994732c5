"""Fixtures for end-to-end tests of ``execgate mcp`` (helpers: mcpharness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mcpharness import Mcp, clean_up, make_world


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[Mcp]:
    world = make_world(tmp_path)
    yield world
    clean_up(world)
