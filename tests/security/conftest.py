"""Fixtures for attacks on execgate's own trust boundary (helpers: securityharness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from securityharness import World, end_world, new_world


@pytest.fixture(params=["root", "unprivileged"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A world of homes, a workspace and rules, as root and as the unprivileged user."""
    user = None
    root = tmp_path
    if request.param == "unprivileged":
        user = request.getfixturevalue("unprivileged")
        root = user.make_dir()
    world = new_world(root, user)
    yield world
    end_world(world)
