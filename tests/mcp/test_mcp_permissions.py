"""Permission requests (`sandbox_permissions`) on `shell` and `exec_command`, end to end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import mcp_types as types
from mcp.client.client import Client
from mcpharness import WS, Elicitations, Mcp, accept, error_text, payload, shell_args
from test_mcp_unified import result_of

UNIFIED = ("--tools", "shell,unified")
RO = ("--sandbox", "read-only")


async def run(client: Client, mcp: Mcp, tool: str, command: str, **extra: Any) -> tuple[int, str]:
    """(exit code, output) of ``command`` through ``tool``."""
    if tool == "shell":
        data = payload(await client.call_tool("shell", shell_args(mcp, command, **extra)))
        return data["exit_code"], data["output"]
    arguments = {"cmd": command, "workdir": str(mcp.work), "login": False, **extra}
    data = result_of(await client.call_tool("exec_command", arguments))
    assert "exit_code" in data, data
    return data["exit_code"], data["output"]


TOOLS = ("shell", "exec_command")


def test_require_escalated_in_read_only(mcp: Mcp) -> None:
    target = mcp.work / "made"
    escalated = {"sandbox_permissions": "require_escalated", "justification": "write a file"}
    answers = Elicitations([accept("once"), types.ElicitResult(action="decline")] * 2)

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *RO, elicit=answers) as client:
            for tool in TOOLS:
                # without a request: read-only
                code, _ = await run(client, mcp, tool, f"echo x > {target}")
                assert code != 0 and not target.exists()
                # approved: runs outside the sandbox, its programs still gated
                code, out = await run(
                    client, mcp, tool, f"echo x > {target}; marker; echo rc=$?", **escalated
                )
                assert target.read_text() == "x\n"
                assert "execgate: denied: marker" in out and "rc=126" in out
                target.unlink()
                # declined: nothing runs
                code, out = await run(client, mcp, tool, f"echo x > {target}", **escalated)
                assert code == 126 and "execgate: denied: permission request" in out
                assert "declined by the user" in out and not target.exists()

    asyncio.run(scenario())
    assert "write a file" in answers.asked[0].message
    assert "outside the sandbox" in answers.asked[0].message


def test_additional_permissions_in_workspace_write(mcp: Mcp) -> None:
    inside, other = mcp.outside / "inside", mcp.root / "other"
    other.mkdir()
    widen = {
        "sandbox_permissions": "with_additional_permissions",
        "justification": "build output",
        "additional_permissions": {"writable_roots": [str(mcp.outside)]},
    }
    answers = Elicitations([accept("once"), types.ElicitResult(action="decline")] * 2)

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *WS, elicit=answers) as client:
            for tool in TOOLS:
                code, _ = await run(client, mcp, tool, f"echo x > {inside}")
                assert code != 0 and not inside.exists()
                # approved: exactly that folder becomes writable, nothing else
                code, out = await run(
                    client, mcp, tool, f"echo x > {inside}; echo y > {other}/f; echo rc=$?", **widen
                )
                assert inside.read_text() == "x\n" and not (other / "f").exists()
                assert "rc=1" in out
                inside.unlink()
                code, out = await run(client, mcp, tool, f"echo x > {inside}", **widen)
                assert code == 126 and "declined by the user" in out and not inside.exists()

    asyncio.run(scenario())
    assert str(mcp.outside) in answers.asked[0].message


def test_no_human_or_on_prompt_deny_is_a_denial_with_a_reason(mcp: Mcp) -> None:
    escalated = {"sandbox_permissions": "require_escalated", "justification": "x"}

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *RO, "--on-prompt", "deny") as client:
            for tool in ("shell", "exec_command"):
                code, out = await run(client, mcp, tool, "echo ran", **escalated)
                assert code == 126 and out.startswith("execgate: denied: permission request")
                assert len(out.splitlines()) == 1  # the command did not run
                assert "prompts are set to deny (--on-prompt deny)" in out

    asyncio.run(scenario())


def test_prefix_rules_banned_partial_and_always(mcp: Mcp) -> None:
    answers = Elicitations([accept("always")])

    def escalated(rule: list[str]) -> dict[str, Any]:
        return {"sandbox_permissions": "require_escalated", "prefix_rule": rule}

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *RO, elicit=answers, rules=False) as client:
            for rule in (["python3"], ["bash", "-lc"], ["env"], ["git"], ["/usr/bin/python3"]):
                result = await client.call_tool(
                    "shell", shell_args(mcp, "python3 -c 'print(1)'", **escalated(rule))
                )
                assert "would approve any command" in error_text(result)
            result = await client.call_tool(
                "exec_command",
                {"cmd": "other a; marker b", "workdir": str(mcp.work), **escalated(["other"])},
            )
            assert "does not start every command" in error_text(result)
            result = await client.call_tool(
                "shell",
                shell_args(mcp, "other", sandbox_permissions="use_default", prefix_rule=["other"]),
            )
            assert "only with `sandbox_permissions`: require_escalated" in error_text(result)
            # "always": the proposed rule is appended to the user's rules
            code, out = await run(
                client, mcp, "shell", "other one && other two", **escalated(["other"])
            )
            assert code == 0 and "other ran:one" in out and "other ran:two" in out

    asyncio.run(scenario())
    assert answers.asked[0].requested_schema["properties"]["decision"]["enum"][-2:] == [
        "always",
        "deny",
    ] or "always" in json.dumps(answers.asked[0].requested_schema)
    rules = (mcp.root / "execgate-home" / "rules").glob("*.rules")
    assert any('prefix_rule(pattern=["other"], decision="allow")' in p.read_text() for p in rules)
