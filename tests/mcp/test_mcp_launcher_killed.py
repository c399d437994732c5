"""An MCP tool call that kills its own launcher: nothing it started outlives the call, and the
server keeps serving."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

from mcpharness import Mcp, RawServer, payload, shell_args

KILL_THE_LAUNCHER = r"""
(exec -a {tag}-a sleep 1000) &
(setsid bash -c 'exec -a {tag}-b sleep 1000' &) &
( (exec -a {tag}-c sleep 1000) & ) &
sleep 0.5
p=$$
while [ "$p" -gt 1 ]; do
    read -r comm < /proc/$p/comm
    if [ "$comm" = execgate-launch ]; then echo killing; kill -9 "$p"; break; fi
    read -r _ _ _ p _ < /proc/$p/stat
done
exec -a {tag}-main sleep 1000
"""


def _survivors(tag: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def test_killed_launcher_leaves_nothing_behind(mcp: Mcp) -> None:
    mcp.write_rules("")

    async def scenario() -> None:
        async with mcp.client("--sandbox", "off") as client:
            args = shell_args(mcp, KILL_THE_LAUNCHER.format(tag=mcp.tag), timeout_ms=60_000)
            result = await client.call_tool("shell", args)
            assert "the session launcher exited" in str(result.content), result
            deadline = time.monotonic() + 30  # a failure guard: they are killed at once
            while _survivors(mcp.tag) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert _survivors(mcp.tag) == []
            # the server is still there and serves the next call
            data = payload(await client.call_tool("shell", shell_args(mcp, "echo still here")))
            assert data["output"] == "still here\n"

    asyncio.run(scenario())


def test_killed_launcher_leaves_nothing_behind_unprivileged(unprivileged: Any) -> None:
    """The same as an ordinary user, over raw stdio."""
    folder = unprivileged.make_dir()
    tag = f"egtag{folder.name[-8:]}m"
    with RawServer(unprivileged, folder) as server:
        command = KILL_THE_LAUNCHER.format(tag=tag)
        answer = server.shell(command=command, workdir=str(folder), login=False, timeout_ms=60_000)
        assert "the session launcher exited" in json.dumps(answer), answer
        deadline = time.monotonic() + 30  # a failure guard: they are killed at once
        while _survivors(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _survivors(tag) == []
