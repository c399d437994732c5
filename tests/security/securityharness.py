"""Helpers for attacks on execgate's own trust boundary, performed for real from inside gated
sessions (``execgate run`` and ``execgate mcp``), as root and as an unprivileged user."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mcp"))

from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcpharness import Elicit, Mcp, clean_up, make_world

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent
#: Confine to the workspace only (pytest's tmp dirs live under /tmp, writable by default).
WS = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]
MODES = {
    "off": ["--sandbox", "off"],
    "workspace-write": WS,
    "strict-exec": [*WS, "--strict-exec"],
}


class World:
    """An :class:`Mcp` world, run by root or by the unprivileged user (``runner``)."""

    def __init__(self, mcp: Mcp, user: Any | None) -> None:
        self.mcp = mcp
        self.user = user

    @property
    def env(self) -> dict[str, str]:
        return self.mcp.env

    def argv(self, command: list[str]) -> list[str]:
        return self.user.argv(command) if self.user else command

    def run(
        self, command: list[str], *, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command),
            env=self.env,
            cwd=cwd or self.mcp.work,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def approvals(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "execgate", "approvals", *args])

    @contextlib.asynccontextmanager
    async def client(
        self, *options: str, rules: bool = True, elicit: Elicit | None = None
    ) -> AsyncIterator[Client]:
        """``execgate mcp [--rules RULES] OPTIONS`` as this world's user, driven by the SDK
        (``elicit`` answers elicitations)."""
        argv = self.argv([sys.executable, *self.mcp.server_args(*options, rules=rules)])
        params = StdioServerParameters(
            command=argv[0], args=argv[1:], env=self.env, cwd=self.mcp.work
        )
        log_path = self.mcp.root / f"server-{len(self.mcp.logs)}.log"
        self.mcp.logs.append(log_path)
        with log_path.open("w") as errlog:
            transport = stdio_client(params, errlog=errlog)
            async with Client(transport, mode="legacy", elicitation_callback=elicit) as client:
                yield client


def new_world(root: Path, user: Any | None) -> World:
    """A fresh world in ``root`` (owned by ``user`` when given)."""
    mcp = make_world(root)
    if user is not None:
        user.chown_tree(root)
    return World(mcp, user)


def end_world(world: World) -> None:
    clean_up(world.mcp)
