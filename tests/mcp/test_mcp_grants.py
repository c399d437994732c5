"""Issue 9 items 1 and 2 through ``execgate mcp``: set-id programs hand out no ungated children,
and an escalated git runs none of the caller's code."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from mcpharness import WS, Mcp, payload, shell_args

OFF = ["--sandbox", "off"]


@pytest.mark.parametrize("options", [OFF, WS], ids=["off", "workspace-write"])
def test_set_id_programs_do_not_run_the_forbidden_marker(mcp: Mcp, options: list[str]) -> None:
    async def scenario() -> None:
        async with mcp.client(*options) as client:
            script = "echo marker | newgrp; ssh-agent marker; sg root -c marker; echo after"
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        assert "marker ran" not in data["output"], data["output"]
        assert data["output"].splitlines()[-1] == "after"
        if options == OFF:
            assert data["output"].count("no rule names it") == 3, data["output"]

    asyncio.run(scenario())


def test_an_escalated_git_runs_none_of_the_callers_code(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["git", "diff"], "allow")\n')
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(mcp.work)]
    subprocess.run(["git", "init", "-q", str(mcp.work)], check=True)
    (mcp.work / "f").write_text("one\n")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (mcp.work / "f").write_text("two\n")
    hook = mcp.work / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {mcp.outside}/ran-hook\n")
    hook.chmod(0o755)

    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            script = (
                f"GIT_EXTERNAL_DIFF={hook} GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor "
                f"GIT_CONFIG_VALUE_0={hook} git diff; echo after"
            )
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        assert "+two" in data["output"], data["output"]  # git diff ran, escalated
        assert data["output"].splitlines()[-1] == "after"
        assert not (mcp.outside / "ran-hook").exists()

    asyncio.run(scenario())
