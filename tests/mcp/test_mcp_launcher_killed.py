"""An MCP tool call that kills its own launcher: nothing it started outlives the call, and the
server keeps serving."""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import time
from typing import Any

from mcpharness import Mcp, payload, shell_args

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
    (folder / "empty.rules").write_text("")
    unprivileged.chown_tree(folder)
    tag = f"egtag{folder.name[-8:]}m"
    server = subprocess.Popen(
        unprivileged.argv(
            [
                sys.executable,
                "-m",
                "execgate",
                "mcp",
                "--sandbox",
                "off",
                "--rules",
                str(folder / "empty.rules"),
            ]
        ),
        env=unprivileged.env(),
        cwd=folder,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None

    def send(message: dict[str, Any]) -> None:
        assert server.stdin is not None
        server.stdin.write(json.dumps(message).encode() + b"\n")
        server.stdin.flush()

    def receive() -> dict[str, Any]:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 120)  # a hang guard
        assert ready, "no answer"
        answer: dict[str, Any] = json.loads(server.stdout.readline())
        return answer

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})  # fmt: skip
        assert receive()["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        arguments = {"command": KILL_THE_LAUNCHER.format(tag=tag), "workdir": str(folder),
                     "login": False, "timeout_ms": 60_000}  # fmt: skip
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "shell", "arguments": arguments}})  # fmt: skip
        answer = receive()
        assert "the session launcher exited" in json.dumps(answer), answer
        deadline = time.monotonic() + 30  # a failure guard: they are killed at once
        while _survivors(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _survivors(tag) == []
    finally:
        server.stdin.close()
        server.stdout.close()
        assert server.wait(timeout=60) == 0
