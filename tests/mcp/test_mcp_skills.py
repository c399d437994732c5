"""Skill scripts (`<skills dir>/<skill>/scripts/`) always ask, by every route: executed, given to
an interpreter, sourced, through a symlink or a hard link; "for this session" is keyed by the
script's canonical path."""

from __future__ import annotations

import asyncio
import os
import shutil

import mcp_types as types
from mcpharness import WS, Elicitations, Mcp, accept, payload, shell_args


def test_skill_scripts_ask_by_every_route(mcp: Mcp) -> None:
    scripts = mcp.root / "codex-home" / "skills" / "demo" / "scripts"
    scripts.mkdir(parents=True)
    hello, other = scripts / "hello.sh", scripts / "other.sh"
    for script in (hello, other):
        script.write_text(f'#!/bin/sh\necho "{script.stem} ran:$*"\n')
        script.chmod(0o755)
    say = scripts / "say"
    echo = shutil.which("echo")
    assert echo
    shutil.copy(echo, say)  # a binary: the fast path must send it to the server too
    # the rules allow them: skill scripts ask anyway
    mcp.write_rules(
        f'prefix_rule(["{hello}"], "allow")\nprefix_rule(["{say}"], "allow")\n'
        'prefix_rule(["marker"], "forbidden")\n'
    )
    answers = Elicitations(
        [
            accept("once"),  # say one
            types.ElicitResult(action="decline"),  # say two
            accept("session"),  # bash hello.sh
            types.ElicitResult(action="decline"),  # source other.sh
            accept("once"),  # the hard link of say
        ]
    )

    async def run(client: object, command: str) -> str:
        data = payload(await client.call_tool("shell", shell_args(mcp, command)))  # type: ignore[attr-defined]
        return str(data["output"])

    async def scenario() -> None:
        async with mcp.client(*WS, elicit=answers) as client:
            assert "one" in await run(client, f"{say} one")
            out = await run(client, f"{say} two; echo rc=$?")
            assert "execgate: denied" in out and "rc=126" in out
            assert "hello ran:a" in await run(client, f"bash {hello} a")
            # approved for the session by path: executed, sourced, through a symlink
            out = await run(
                client,
                f"{hello} b; . {hello}; ln -s {hello} {mcp.work}/link; {mcp.work}/link d",
            )
            assert "hello ran:b" in out and "hello ran:" in out and "hello ran:d" in out
            assert len(answers.asked) == 3
            out = await run(client, f"source {other}; echo after")
            assert "execgate: denied: source" in out and "other ran" not in out
            assert "after" not in out  # nothing of the command ran
            # a hard link elsewhere is the same file (made here: the sandbox's mounts keep a
            # sandboxed process from linking across them)
            os.link(say, mcp.work / "hl")
            out = await run(client, f"{mcp.work}/hl x")
            assert out.strip().endswith("x")
        assert len(answers.asked) == 5
        assert "skill scripts always ask" in answers.asked[0].message
        assert str(say) in answers.asked[0].message

    asyncio.run(scenario())
