"""Malformed JSON-RPC gets the standard error answers, an oversized command a one-line error,
and a client that disappears while an approval is pending ends the server cleanly."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from mcpharness import Mcp, PipeLines, error_text, shell_args

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


class RawClient:
    """``execgate mcp`` on pipes, spoken to line by line."""

    def __init__(self, mcp: Mcp, *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *mcp.server_args(*options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=mcp.env,
            cwd=mcp.work,
        )
        self.lines = PipeLines(self.proc.stdout)
        self.send(json.dumps(INIT).encode())
        assert self.receive()["id"] == 1
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float = 60) -> dict[str, Any]:
        return self.lines.message(timeout)

    def hang_up(self) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.stdout.close()
        code = self.proc.wait(timeout=60)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read().decode()


def test_malformed_messages_get_standard_errors(mcp: Mcp) -> None:
    client = RawClient(mcp)
    cases = [
        (b"{not json", None, -32700),
        (b"[]", None, -32600),
        (b'"just a string"', None, -32600),
        (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":[1,2]}', 5, -32602),
        (b'{"jsonrpc":"2.0","id":"six","method":"tools/list","params":"x"}', "six", -32602),
        (b'{"jsonrpc":"2.0","id":7}', 7, -32600),
    ]
    for line, request_id, code in cases:
        client.send(line)
        answer = client.receive()
        assert answer["id"] == request_id and answer["error"]["code"] == code, (line, answer)
    # a notification is never answered, even a malformed one; the next request still is
    client.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":[]}')
    client.send(b'{"jsonrpc":"2.0","id":9,"method":"tools/list"}')
    answer = client.receive()
    assert answer["id"] == 9 and answer["result"]["tools"][0]["name"] == "shell"
    code, log = client.hang_up()
    assert code == 0 and "Traceback" not in log and "internal error" not in log


def test_client_gone_while_an_approval_is_pending(mcp: Mcp) -> None:
    client = RawClient(mcp)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "shell", "arguments": shell_args(mcp, "askme; echo after")},
    }
    client.send(json.dumps(call).encode())
    asked = client.receive()
    assert asked["method"] == "elicitation/create", asked
    code, log = client.hang_up()
    assert code == 0, log
    assert "internal error" not in log and "ExceptionGroup" not in log and "Traceback" not in log
    deadline = time.monotonic() + 30  # a failure guard
    while mcp.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mcp.leftovers() == []


def test_a_20_mb_command_is_a_one_line_error(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            command = "echo " + "a" * (20 * 1024 * 1024)
            text = error_text(await client.call_tool("shell", shell_args(mcp, command)))
            assert text.count("\n") == 0 and len(text) < 300, text[:300]
            assert "too long: 20971525 bytes" in text, text
            # and the server is fine afterwards
            ok = await client.call_tool("shell", shell_args(mcp, "echo fine"))
            assert not ok.is_error

    asyncio.run(scenario())
    assert "Traceback" not in mcp.log()
