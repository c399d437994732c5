"""What the policy does to a tool call's programs: allowed ones escalate out of the sandbox,
forbidden ones fail with a readable denial (the call itself does not fail), unmatched ones run
confined; the configured sandbox applies with no client setup at all."""

from __future__ import annotations

import asyncio
import json

from mcpharness import WS, Mcp, payload, shell_args


def test_allowed_program_escalates_out_of_the_sandbox(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["touch"], "allow")\n')
    inside, outside = mcp.work / "in", mcp.outside / "out"

    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            script = (
                f"echo x > {inside}; echo rc1=$?; echo x > {outside}; echo rc2=$?;"
                f" touch {outside}; echo rc3=$?"
            )
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        assert "rc1=0" in data["output"]  # the workdir is writable
        assert "rc2=1" in data["output"]  # outside it the sandboxed shell cannot write
        assert "rc3=0" in data["output"]  # but the allowed `touch` runs outside the sandbox
        assert inside.read_text() == "x\n"
        assert outside.exists() and outside.read_text() == ""

    asyncio.run(scenario())


def test_forbidden_program_is_denied_inside_a_normal_result(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            script = "echo before; marker arg; echo rc=$?; other; echo after"
            result = await client.call_tool("shell", shell_args(mcp, script))
        data = payload(result)
        lines = data["output"].splitlines()
        assert lines[0] == "before"
        assert lines[1] == (
            f"execgate: denied: marker arg: marker must not run (rule {mcp.rules}:1)"
        )
        assert "rc=126" in lines
        assert "other ran:" in lines  # unmatched: runs (confined)
        assert lines[-1] == "after"
        assert data["exit_code"] == 0

    asyncio.run(scenario())


def test_forbidden_shell_itself_gives_a_denied_result(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["bash"], "forbidden", justification="no shells today")\n')

    async def scenario() -> None:
        async with mcp.client() as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "echo hi")))
        assert data["exit_code"] == 126
        assert data["output"].startswith("execgate: denied: ")
        assert "no shells today" in data["output"]

    asyncio.run(scenario())


def test_default_profile_is_workspace_write_without_any_client_setup(mcp: Mcp) -> None:
    """No codex/sandbox-state/update ever arrives: calls still work, confined to the workdir."""

    async def scenario() -> None:
        async with mcp.client("--exclude-tmp", "--exclude-tmpdir") as client:
            script = f"echo a > ok; echo rc1=$?; echo b > {mcp.outside}/no; echo rc2=$?; cat ok"
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        lines = data["output"].splitlines()
        assert lines[0] == "rc1=0"
        assert lines[-2:] == ["rc2=1", "a"]  # (bash's "Permission denied" line in between)
        assert not (mcp.outside / "no").exists()

    asyncio.run(scenario())


def test_layered_policy_and_audit_log(mcp: Mcp) -> None:
    """Without --rules the user's layer applies; --audit records each decision."""
    user_rules = mcp.root / "execgate-home" / "rules" / "mine.rules"
    mcp.write_rules('prefix_rule(["marker"], "forbidden", justification="mine")\n', user_rules)
    audit = mcp.root / "audit.jsonl"

    async def scenario() -> None:
        async with mcp.client("--audit", str(audit), rules=False) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "marker; other")))
        assert "marker must not run" not in data["output"]
        assert f"execgate: denied: marker: mine (rule {user_rules}:1)" in data["output"]

    asyncio.run(scenario())
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    verdicts = {(e["argv"][0], e["decision"]) for e in entries}
    assert ("marker", "deny") in verdicts
    assert ("other", "run") in verdicts
