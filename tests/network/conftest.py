"""Fixtures for the proxy tests: servers on loopback, and real proxied sessions as root and
as the unprivileged user (helpers: proxyharness.py)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mcp"))  # mcpharness
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # gate.test_run_terminal

from mcpharness import Mcp, clean_up, make_world
from netservers import Servers, start_servers
from proxyharness import Proxied, make_proxied


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    directory = Path(tempfile.mkdtemp(prefix="execgate-net-"))
    found = start_servers(directory)
    yield found
    found.close()


@pytest.fixture(params=["root", "user"])
def proxied(request: pytest.FixtureRequest, servers: Servers, tmp_path: Path) -> Proxied:
    """A proxied session's world, as root and as the unprivileged user."""
    user = request.getfixturevalue("unprivileged") if request.param == "user" else None
    base = user.make_dir() if user is not None else tmp_path
    return make_proxied(servers, base, user)


@pytest.fixture
def proxied_root(tmp_path: Path, servers: Servers) -> Proxied:
    return make_proxied(servers, tmp_path, None)


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[Mcp]:
    world = make_world(tmp_path)
    yield world
    clean_up(world)
