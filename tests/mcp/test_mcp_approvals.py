"""Clients that cannot ask the human: pending approvals are answered with `execgate approvals`
from another process, or denied after the approval timeout with a message saying how to allow
the command. And a 2026-07-28 client that never comes back with an answer."""

from __future__ import annotations

import asyncio
import json
import os

import mcp_types as types
import pytest
from mcpharness import Elicitations, Mcp, error_text, payload, shell_args

MODES = ["legacy", "auto"]


async def _wait_pending(mcp: Mcp) -> list[dict[str, object]]:
    return await asyncio.to_thread(mcp.wait_for, mcp.pending, "a pending approval")


@pytest.mark.parametrize("mode", MODES)
def test_no_elicitation_allow_from_another_process(mcp: Mcp, mode: str) -> None:
    async def scenario() -> None:
        async with mcp.client(mode=mode) as client:
            call = asyncio.ensure_future(
                client.call_tool("shell", shell_args(mcp, "askme one two; echo rc=$?"))
            )
            [pending] = await _wait_pending(mcp)
            assert pending["command"] == "askme one two"
            assert pending["argv"] == ["askme", "one", "two"]
            assert pending["cwd"] == str(mcp.work)
            assert pending["asked_via"] == "none"
            listing = await asyncio.to_thread(mcp.approvals, "list")
            assert f"execgate approvals allow|deny {pending['id']}" in listing.stdout
            assert f"rule:    {mcp.rules}:2 (prefix `askme`)" in listing.stdout
            answered = await asyncio.to_thread(mcp.approvals, "allow", str(pending["id"]))
            assert answered.returncode == 0, answered.stderr
            assert f"{pending['id']}: allowed (once): askme one two" in answered.stdout
            data = payload(await call)
        assert data["output"] == "askme ran:one two\nrc=0\n"
        log = mcp.log()
        assert f"execgate approvals allow {pending['id']}" in log  # told the human how

    asyncio.run(scenario())


@pytest.mark.parametrize("option", ["always", "never"])
def test_elicitation_option_falls_back_to_the_control_socket(mcp: Mcp, option: str) -> None:
    """`--elicitation always` asks a client that declared no elicitation: it refuses, and the
    question stays answerable from a terminal. `--elicitation never` does not ask a client
    that could."""
    capable = Elicitations() if option == "never" else None  # fails the test if called

    async def scenario() -> None:
        async with mcp.client("--elicitation", option, elicit=capable) as client:
            call = asyncio.ensure_future(client.call_tool("shell", shell_args(mcp, "askme")))
            [pending] = await _wait_pending(mcp)
            if option == "always":  # the client's refusal was seen before the fallback
                await asyncio.to_thread(
                    mcp.wait_for, lambda: "could not show approval" in mcp.log(), "the refusal"
                )
            answered = await asyncio.to_thread(mcp.approvals, "allow", str(pending["id"]))
            assert answered.returncode == 0, answered.stderr
            assert payload(await call)["output"] == "askme ran:\n"

    asyncio.run(scenario())


def test_no_elicitation_deny_with_reason_and_short_id(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            call = asyncio.ensure_future(
                client.call_tool("shell", shell_args(mcp, "askme; echo rc=$?"))
            )
            [pending] = await _wait_pending(mcp)
            short = str(pending["id"]).rpartition(".")[2]
            answered = await asyncio.to_thread(
                mcp.approvals, "deny", short, "--reason", "use the staging server"
            )
            assert answered.returncode == 0, answered.stderr
            data = payload(await call)
        lines = data["output"].splitlines()
        assert lines[0] == (
            "execgate: denied: askme: denied by execgate approvals: use the staging server"
        )
        assert lines[-1] == "rc=126"

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_unanswered_approval_is_denied_saying_how_to_allow_it(mcp: Mcp, mode: str) -> None:
    async def scenario() -> None:
        async with mcp.client("--approval-timeout", "1", mode=mode) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "askme; echo rc=$?")))
        first = data["output"].splitlines()[0]
        assert first.startswith("execgate: denied: askme: askme needs a human; ")
        assert "no elicitation support" in first
        assert "within 1 s" in first
        assert 'add prefix_rule(pattern=["askme"], decision="allow")' in first
        assert data["timed_out"] is False

    asyncio.run(scenario())


def test_on_prompt_deny_never_asks(mcp: Mcp) -> None:
    answers = Elicitations()  # fails the test if called

    async def scenario() -> None:
        async with mcp.client("--on-prompt", "deny", elicit=answers) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "askme; echo rc=$?")))
        first = data["output"].splitlines()[0]
        assert first.startswith("execgate: denied: askme: askme needs a human; prompts are set")

    asyncio.run(scenario())


def test_approvals_cli_errors_and_stale_servers(mcp: Mcp) -> None:
    result = mcp.approvals("list")
    assert result.returncode == 0
    assert "no execgate mcp server is running" in result.stdout
    # a server that died without cleaning up
    run = mcp.control_dir()
    run.mkdir(mode=0o700, parents=True, exist_ok=True)
    stale = run / "mcp-999999999.json"
    stale.write_text(json.dumps({"pid": 999999999, "socket": str(run / "gone.sock")}))
    result = mcp.approvals("allow", "999999999.1")
    assert result.returncode == 1
    assert result.stderr.strip() == "execgate: error: no execgate mcp server is running"
    assert not stale.exists()

    async def scenario() -> None:
        async with mcp.client() as client:
            # the server answers `initialize` first, then opens its control channel
            await asyncio.to_thread(mcp.wait_for, lambda: list(run.glob("mcp-*.json")), "control")
            result = await asyncio.to_thread(mcp.approvals, "list")
            assert "no pending approvals" in result.stdout
            result = await asyncio.to_thread(mcp.approvals, "allow", "12345")
            assert result.returncode == 1
            assert "no pending approval 12345" in result.stderr
            descriptor = next(run.glob("mcp-*.json"))
            info = json.loads(descriptor.read_text())
            assert os.stat(info["socket"]).st_mode & 0o777 == 0o600
            await client.list_tools()
        assert list(run.glob("mcp-*")) == []  # the server removed its files

    asyncio.run(scenario())


def test_elicitation_and_control_socket_race_first_answer_wins(mcp: Mcp) -> None:
    """A question shown by the client can also be answered from a terminal; the client's
    request is then cancelled."""
    shown = asyncio.Event()

    async def never_answers(
        context: object, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        shown.set()
        await asyncio.Event().wait()  # the human never clicks; cancelled by the server
        raise AssertionError("unreachable")

    async def scenario() -> None:
        async with mcp.client(elicit=never_answers) as client:
            call = asyncio.ensure_future(client.call_tool("shell", shell_args(mcp, "askme")))
            await asyncio.wait_for(shown.wait(), 60)
            [pending] = await asyncio.to_thread(mcp.pending)
            assert pending["asked_via"] == "elicitation"
            answered = await asyncio.to_thread(mcp.approvals, "allow", str(pending["id"]))
            assert answered.returncode == 0, answered.stderr
            data = payload(await call)
            assert data["output"] == "askme ran:\n"

    asyncio.run(scenario())


def test_modern_client_that_never_retries(mcp: Mcp) -> None:
    """2026-07-28: the tool call returns an input request while the exec stays paused. A client
    that never comes back gets a denial after the approval timeout, and the call is stopped."""
    rc_file = mcp.work / "rc.txt"

    async def scenario() -> None:
        # an elicitation callback (never called: we drive the rounds by hand) for the capability
        capable = Elicitations()
        async with mcp.client("--approval-timeout", "1", mode="auto", elicit=capable) as client:
            script = f"askme; echo rc=$? > {rc_file}; {mcp.napper} 1000"
            first = await client.session.call_tool(
                "shell", shell_args(mcp, script), allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)
            assert first.request_state
            [(key, request)] = (first.input_requests or {}).items()
            assert isinstance(request, types.ElicitRequest)
            assert isinstance(request.params, types.ElicitRequestFormParams)
            assert "/bin/askme` requires approval" in request.params.message
            # nobody answers: after 1 s the exec is denied and the script goes on
            await asyncio.to_thread(mcp.wait_for, rc_file.exists, "the denial")
            assert rc_file.read_text() == "rc=126\n"
            # ... and the abandoned call is stopped (no process of it left)
            await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the cleanup")
            late = await client.session.call_tool(
                "shell",
                shell_args(mcp, script),
                request_state=first.request_state,
                input_responses={key: types.ElicitResult(action="accept", content={})},
                allow_input_required=True,
            )
            assert isinstance(late, types.CallToolResult)
            assert "no longer pending" in error_text(late)

    asyncio.run(scenario())
    assert "did not come back" in mcp.log()
