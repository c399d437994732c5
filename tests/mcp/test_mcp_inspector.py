"""A third-party client: the MCP Inspector CLI (TypeScript SDK) lists the tool and calls it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcpharness import Mcp

REPO = Path(__file__).resolve().parents[2]
NODE_PREFIX = REPO / ".ci" / "node"
PACKAGE = "@modelcontextprotocol/inspector-cli@1.0.3"
CLI_DIR = NODE_PREFIX / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build"


def _inspector() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not installed")
    if not (CLI_DIR / "cli.js").exists():
        installed = subprocess.run(
            [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", NODE_PREFIX,
             PACKAGE],
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
        if installed.returncode != 0 or not (CLI_DIR / "cli.js").exists():
            pytest.skip(f"cannot install {PACKAGE}: {installed.stderr.strip()[-300:]}")
    return CLI_DIR / "cli.js"


def _run(mcp: Mcp, cli: Path, *method: str) -> Any:
    isolated = [f"{k}={v}" for k, v in mcp.env.items() if k != "PATH"]
    command = ["node", str(cli), "--cli"]
    for pair in isolated:
        command += ["-e", pair]
    command += ["--", sys.executable, *mcp.server_args(), *method]
    # inspector-cli 1.0.3 finds its own package.json relative to the working directory
    result = subprocess.run(
        command, cwd=CLI_DIR, env=mcp.env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_inspector_cli_lists_and_calls_shell(mcp: Mcp) -> None:
    cli = _inspector()
    listing = _run(mcp, cli, "--method", "tools/list")
    [tool] = listing["tools"]
    assert tool["name"] == "shell"
    assert tool["inputSchema"]["required"] == ["command", "workdir"]
    assert "outputSchema" in tool
    called = _run(
        mcp,
        cli,
        "--method",
        "tools/call",
        "--tool-name",
        "shell",
        "--tool-arg",
        "command=echo hi; echo err >&2; marker",
        "--tool-arg",
        f"workdir={mcp.work}",
        "--tool-arg",
        "login=false",
    )
    assert called["isError"] is False
    [item] = called["content"]
    data = json.loads(item["text"])
    assert data["output"].startswith("hi\nerr\nexecgate: denied: marker: marker must not run")
    assert called["structuredContent"]["exit_code"] == data["exit_code"] == 126
