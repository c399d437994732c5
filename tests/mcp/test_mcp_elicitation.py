"""`prompt` decisions put to the human through the MCP client, in both protocol generations:
mid-call `elicitation/create` (legacy) and the 2026-07-28 input-required round trip (auto)."""

from __future__ import annotations

import asyncio
import json

import mcp_types as types
import pytest
from mcpharness import Elicitations, Mcp, accept, payload, shell_args

MODES = ["legacy", "auto"]


@pytest.mark.parametrize("mode", MODES)
def test_accept_runs_the_program_escalated(mcp: Mcp, mode: str) -> None:
    answers = Elicitations([accept("once", reason="looks fine")])
    audit = mcp.root / "audit.jsonl"

    async def scenario() -> None:
        async with mcp.client("--audit", str(audit), mode=mode, elicit=answers) as client:
            script = "echo before; askme hello world; echo rc=$?"
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        assert data["output"] == "before\naskme ran:hello world\nrc=0\n"
        assert data["exit_code"] == 0

    asyncio.run(scenario())
    [asked] = answers.asked
    message = asked.message
    # the headline names the program that was identified; argv as the caller gave it
    assert f"`{mcp.bin}/askme hello world` requires approval: askme needs a human" in message
    assert "argv:    askme hello world" in message
    assert f"cwd:     {mcp.work}" in message
    assert f"rule:    {mcp.rules}:2 (prefix `askme`)" in message
    schema = asked.requested_schema
    assert schema["required"] == ["decision"]
    # explicit --rules files: no "always" (nothing to record it in)
    assert schema["properties"]["decision"]["enum"] == ["once", "session", "deny"]
    assert "reason" in schema["properties"]
    # the human's reason is kept: in the audit log and the server's log
    answers_logged = [
        json.loads(line) for line in audit.read_text().splitlines() if '"answer"' in line
    ]
    assert answers_logged[0]["decision"] in ("run", "escalate")
    assert answers_logged[0]["answer"] == "once"
    assert answers_logged[0]["answered_by"] == "elicitation"
    assert answers_logged[0]["answer_reason"] == "looks fine"
    assert "reason: looks fine" in mcp.log()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (types.ElicitResult(action="decline"), "declined by the user"),
        (types.ElicitResult(action="cancel"), "the user dismissed the approval request"),
        (accept("deny", reason="not today"), "denied by the user: not today"),
    ],
)
def test_decline_cancel_and_deny_are_readable_denials(
    mcp: Mcp, mode: str, answer: types.ElicitResult, why: str
) -> None:
    answers = Elicitations([answer])

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "askme; echo rc=$?")))
        lines = data["output"].splitlines()
        assert lines[0] == f"execgate: denied: askme: {why}"
        assert lines[-1] == "rc=126"
        assert "askme ran" not in data["output"]

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_allow_for_the_session_lasts_across_calls(mcp: Mcp, mode: str) -> None:
    answers = Elicitations([accept("session")])

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers) as client:
            for _ in range(3):
                data = payload(await client.call_tool("shell", shell_args(mcp, "askme x")))
                assert data["output"] == "askme ran:x\n"
        assert len(answers.asked) == 1
        async with mcp.client(mode=mode, elicit=Elicitations([accept("once")])) as client:
            # a new connection is a new session: asked again
            data = payload(await client.call_tool("shell", shell_args(mcp, "askme y")))
            assert data["output"] == "askme ran:y\n"

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_always_appends_an_allow_rule_to_the_user_rules(mcp: Mcp, mode: str) -> None:
    user_rules = mcp.root / "execgate-home" / "rules" / "default.rules"
    mcp.write_rules('prefix_rule(["askme", "x"], "prompt")\n', user_rules)
    answers = Elicitations([accept("always")])

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers, rules=False) as client:
            for _ in range(2):
                data = payload(await client.call_tool("shell", shell_args(mcp, "askme x 1")))
                assert data["output"] == "askme ran:x 1\n"
        assert len(answers.asked) == 1
        assert answers.asked[0].requested_schema["properties"]["decision"]["enum"] == [
            "once",
            "session",
            "always",
            "deny",
        ]
        assert 'prefix_rule(pattern=["askme", "x"], decision="allow")' in user_rules.read_text()
        async with mcp.client(mode=mode, rules=False) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "askme x 2")))
            assert data["output"] == "askme ran:x 2\n"  # no elicitation callback: not asked

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_slow_answer_outlasts_the_timeout_because_the_clock_pauses(mcp: Mcp, mode: str) -> None:
    """timeout_ms is 1000; the human takes 2.5 s; the command still completes."""

    async def slowly() -> types.ElicitResult:
        await asyncio.sleep(2.5)  # the human thinking (the scenario, not synchronisation)
        return accept("once")

    answers = Elicitations([slowly])

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers) as client:
            script = "echo start; askme; echo done"
            data = payload(
                await client.call_tool("shell", shell_args(mcp, script, timeout_ms=1000))
            )
        assert data["timed_out"] is False
        assert data["output"] == "start\naskme ran:\ndone\n"
        assert data["duration"]["secs"] >= 2  # wall time includes the wait

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_time_before_and_after_a_question_still_counts(mcp: Mcp, mode: str) -> None:
    """The clock pauses for the question, not beyond: 2 s of work after a quick answer
    exceeds a 1 s limit."""
    answers = Elicitations([accept("once")])

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers) as client:
            script = f"askme; echo answered; {mcp.napper} 20; echo never"
            data = payload(
                await client.call_tool("shell", shell_args(mcp, script, timeout_ms=1000))
            )
        assert data["timed_out"] is True
        assert data["exit_code"] == 124
        assert data["output"] == "askme ran:\nanswered\n"

    asyncio.run(scenario())
    assert mcp.leftovers() == []


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_questions_of_one_call(mcp: Mcp, mode: str) -> None:
    """Two prompted programs waiting at once (background jobs): both are asked, both run."""
    answers = Elicitations(default=accept("once"))

    async def scenario() -> None:
        async with mcp.client(mode=mode, elicit=answers) as client:
            script = "askme a & askme b & wait; echo both"
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
        lines = sorted(data["output"].splitlines())
        assert lines == ["askme ran:a", "askme ran:b", "both"]
        assert len(answers.asked) == 2

    asyncio.run(scenario())
