"""Rules hot reload: an edited rules file applies from the next call on, with no restart; an
edit that does not load keeps the previous policy and the log says why (file:line)."""

from __future__ import annotations

import asyncio

from mcp.client.client import Client
from mcpharness import Mcp, payload, shell_args


def test_edited_rules_apply_to_the_next_call(mcp: Mcp) -> None:
    async def marker_output(client: Client) -> str:
        result = await client.call_tool("shell", shell_args(mcp, "marker"))
        return str(payload(result)["output"])

    async def scenario() -> None:
        async with mcp.client() as client:
            assert (await marker_output(client)).startswith("execgate: denied: marker:")
            mcp.write_rules('prefix_rule(["marker"], "allow")\n')
            assert await marker_output(client) == "marker ran:\n"
            # a broken edit: the previous policy (marker allowed) stays
            mcp.write_rules('prefix_rule(["marker"], "allow")\nprefix_rule(["x"], "maybe")\n')
            assert await marker_output(client) == "marker ran:\n"
            assert f"{mcp.rules}:2:1: invalid decision: maybe" in mcp.log()
            assert "keeping the previous rules" in mcp.log()
            # fixed again: applies
            mcp.write_rules('prefix_rule(["marker"], "forbidden", justification="again")\n')
            output = await marker_output(client)
            assert output.startswith(f"execgate: denied: marker: again (rule {mcp.rules}:1)\n")

    asyncio.run(scenario())
    assert mcp.log().count("invalid decision: maybe") == 1  # said once, not at every poll


def test_new_rules_file_in_the_user_layer_is_picked_up(mcp: Mcp) -> None:
    rules_dir = mcp.root / "execgate-home" / "rules"
    mcp.write_rules('prefix_rule(["other"], "allow")\n', rules_dir / "a.rules")

    async def scenario() -> None:
        async with mcp.client(rules=False) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "marker")))
            assert data["output"] == "marker ran:\n"  # no rule for marker yet
            mcp.write_rules('prefix_rule(["marker"], "forbidden")\n', rules_dir / "b.rules")
            data = payload(await client.call_tool("shell", shell_args(mcp, "marker")))
            assert data["output"].startswith("execgate: denied: marker:")
            (rules_dir / "b.rules").unlink()
            data = payload(await client.call_tool("shell", shell_args(mcp, "marker")))
            assert data["output"] == "marker ran:\n"

    asyncio.run(scenario())


def test_reload_reaches_a_running_call(mcp: Mcp) -> None:
    """The poller republishes the policy to open sessions: a call already running sees it."""
    flag = mcp.work / "go"

    async def scenario() -> None:
        async with mcp.client("--reload-interval", "0.1") as client:
            script = f"while [ ! -e {flag} ]; do sleep 0.02; done; marker; echo done"
            call = asyncio.ensure_future(
                client.call_tool("shell", shell_args(mcp, script, timeout_ms=120_000))
            )
            mcp.write_rules('prefix_rule(["marker"], "allow")\n')
            await asyncio.to_thread(
                mcp.wait_for, lambda: "rules reloaded" in mcp.log(), "the reload"
            )
            flag.touch()
            data = payload(await call)
        lines = data["output"].splitlines()
        assert lines[-2:] == ["marker ran:", "done"]

    asyncio.run(scenario())
