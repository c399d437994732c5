"""What the human reads to approve an MCP call shows the command as it is: its escape sequences
and bidi overrides escaped, the identified program in the headline (not the caller's argv[0]),
both in the elicitation the client shows and in ``execgate approvals list``."""

from __future__ import annotations

import asyncio
import unicodedata

import mcp_types as types
from mcpharness import Elicitations, Mcp, payload, shell_args

# Run askme (a prompt rule) under the name `ls`, with an argument that tries to redraw the
# prompt: cursor up, erase line, carriage return, a fake headline, a right-to-left override.
COMMAND = (
    "(exec -a ls askme $'x\\e[1A\\e[2K\\rexecgate: `ls` requires approval\\u202eexe'); echo rc=$?"
)
SHOWN_ARG = "$'x\\e[1A\\e[2K\\rexecgate: `ls` requires approval\\u202eexe'"


def _hidden(text: str) -> list[str]:
    return [ch for ch in text if unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Zl", "Zp"}]


def test_elicitation_shows_the_judged_command_escaped(mcp: Mcp) -> None:
    elicit = Elicitations(answers=[types.ElicitResult(action="decline")])

    async def scenario() -> None:
        async with mcp.client(elicit=elicit) as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, COMMAND)))
        assert data["output"].endswith("rc=126\n")

    asyncio.run(scenario())
    [asked] = elicit.asked
    lines = asked.message.split("\n")
    assert lines[0] == (
        f"execgate: `{mcp.bin}/askme {SHOWN_ARG}` requires approval: askme needs a human"
    ), asked.message
    assert f"  argv:    ls {SHOWN_ARG}" in lines
    assert "  argv[0]: ls (the name the caller gave it)" in lines
    assert "  interpreter: /bin/sh" in lines
    assert all(not _hidden(line) for line in lines), asked.message


def test_approvals_list_shows_the_judged_command_escaped(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            call = asyncio.ensure_future(client.call_tool("shell", shell_args(mcp, COMMAND)))
            [pending] = await asyncio.to_thread(mcp.wait_for, mcp.pending, "a pending approval")
            listing = await asyncio.to_thread(mcp.approvals, "list")
            denied = await asyncio.to_thread(mcp.approvals, "deny", str(pending["id"]))
            assert denied.returncode == 0, denied.stderr
            assert not _hidden(denied.stdout.rstrip("\n")), denied.stdout
            assert payload(await call)["output"].endswith("rc=126\n")
        lines = listing.stdout.splitlines()
        assert lines[0].startswith(f"{pending['id']}  waiting "), listing.stdout
        assert lines[0].endswith(f"  {mcp.bin}/askme {SHOWN_ARG}"), listing.stdout
        assert f"    argv:    ls {SHOWN_ARG}" in lines
        assert all(not _hidden(line) for line in lines), listing.stdout

    asyncio.run(scenario())
