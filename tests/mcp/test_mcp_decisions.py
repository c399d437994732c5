"""`execgate mcp` in the decision log: each call's decisions under the server's session id,
answers given through elicitation, and a session grant withdrawn with `execgate approvals
revoke` while the server runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mcpharness import Elicitations, Mcp, accept, payload, shell_args


def _records(mcp: Mcp) -> list[dict[str, Any]]:
    log = Path(mcp.env["EXECGATE_HOME"]) / "log" / "decisions.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_session_grant_is_logged_and_revoked_while_the_server_runs(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["askme"], "prompt", justification="askme needs a human")\n')
    answers = Elicitations([accept("session"), accept("deny")])

    async def scenario() -> None:
        async with mcp.client(elicit=answers) as client:
            first = payload(await client.call_tool("shell", shell_args(mcp, "askme 1; askme 2")))
            assert first["output"].count("askme ran") == 2  # asked once, then granted
            grants = json.loads((await asyncio.to_thread(mcp.approvals, "grants", "--json")).stdout)
            [grant] = grants["grants"]
            assert grant["scope"] == "session" and grant["prefix"] == ["askme"]
            assert grant["answered_by"] == "elicitation" and grant["front"] == "mcp"
            revoked = await asyncio.to_thread(mcp.approvals, "revoke", grant["id"])
            assert revoked.returncode == 0, revoked.stderr
            # withdrawn: the next call is asked again (and this time the human declines)
            second = payload(await client.call_tool("shell", shell_args(mcp, "askme 3")))
            assert "askme ran" not in second["output"]
            assert "denied by the user" in second["output"]

    asyncio.run(scenario())
    assert len(answers.asked) == 2
    records = [r for r in _records(mcp) if r.get("kind") == "exec"]
    askme = [r for r in records if r["argv"][0] == "askme"]
    assert [(r.get("answer"), r["source"]) for r in askme] == [
        ("session", "elicitation"),
        (None, "grant"),
        ("deny", "elicitation"),
    ]
    assert len({r["session"] for r in records}) == 1  # one server, one session id
    assert askme[0]["call"] != askme[2]["call"]  # per tool call
    assert _records(mcp)[-1]["kind"] == "exec" and any(
        r.get("kind") == "revoke" for r in _records(mcp)
    )
