"""Self-approval (issue #6 item 2): nothing inside a gated session may reach the approvals
control socket of `execgate mcp`, list its questions or answer them.

The attack runs for real inside an MCP call whose own `askme` waits for approval: it looks for
the socket through the discovery files, by scanning /proc/net/unix, through /proc/PID/root, and
from a grandchild that left the session's process tree; it answers `always` to whatever it can
list. Afterwards the human's own `execgate approvals` still works, and no rule was written.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest
from mcpharness import payload, shell_args

from .securityharness import HERE, MODES, World


def _rules(folder: Path) -> dict[str, bytes]:
    """Every rules file below ``folder`` (where an `always` answer would write)."""
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*.rules")) if p.is_file()}


@pytest.mark.parametrize("via", ["mcp", "run"])
@pytest.mark.parametrize("mode", list(MODES))
def test_gated_command_cannot_reach_or_answer_the_approvals_socket(
    world: World, mode: str, via: str
) -> None:
    """``via``: the attacker runs inside the MCP call that asked (``mcp``), or in an
    ``execgate run`` session of the same user next to the server (``run``)."""
    m = world.mcp
    script = m.work / "attack_control.py"
    shutil.copy(HERE / "attack_control.py", script)
    go, done = m.work / "go", m.work / "done"
    control = m.control_dir()
    # The user's own rules (layered policy): an `always` answer would append to them.
    m.write_rules(m.rules.read_text(), Path(m.env["EXECGATE_HOME"]) / "rules" / "test.rules")
    rules_dirs = [Path(m.env[name]) for name in ("EXECGATE_HOME", "CODEX_HOME", "HOME")]
    before = [_rules(d) for d in rules_dirs]
    if world.user:
        world.user.chown_tree(m.root)
    attack = ["/usr/bin/python3", str(script), str(control), str(go), str(done)]
    command = "askme now & " + (f"{' '.join(attack)}; " if via == "mcp" else "") + "wait; echo end"
    run_output: list[str] = []

    own: list[str] = []  # the server's socket, as its discovery file names it

    async def scenario() -> None:
        async with world.client(*MODES[mode], "--elicitation", "never", rules=False) as client:
            call = asyncio.ensure_future(client.call_tool("shell", shell_args(m, command)))

            def pending() -> list[dict[str, object]]:
                listing = world.approvals("list", "--json")
                assert listing.returncode == 0, listing.stderr
                servers = json.loads(listing.stdout)["servers"]
                return [q for s in servers for q in s["pending"]]

            [question] = await asyncio.to_thread(m.wait_for, pending, "the askme question")
            [descriptor] = control.glob("mcp-*.json")
            own.append(json.loads(descriptor.read_text())["socket"])
            go.touch()
            if via == "run":
                argv = [sys.executable, "-m", "execgate", "run", "--rules", str(m.rules)]
                session = [*argv, *MODES[mode], "--", *attack]
                ran = await asyncio.to_thread(world.run, session)
                assert ran.returncode == 0, ran.stderr
                run_output.append(ran.stdout)
            await asyncio.to_thread(m.wait_for, done.exists, "the attack to finish", 90)
            # The human's channel still works: the question is still pending, and answerable.
            remaining = await asyncio.to_thread(pending)
            denied = await asyncio.to_thread(world.approvals, "deny", str(question["id"]))
            data = payload(await call)
        output = data["output"]
        said = run_output[0] if via == "run" else output
        line = next(x for x in said.splitlines() if x.startswith("ATTACK "))
        reports = json.loads(line.removeprefix("ATTACK "))
        assert [r["who"] for r in reports] == ["process", "orphan"]
        for report in reports:
            assert report["listed"] == [], report
            assert report["answered"] == [], report
            if mode == "off":  # the socket is in view: the server refused the peer
                assert "permission denied" in report["errors"][own[0]], report
            else:  # hidden: the discovery file and the socket are out of reach
                assert own[0] not in report["errors"] or "Error" in report["errors"][own[0]]
        assert [q["id"] for q in remaining] == [question["id"]]
        assert denied.returncode == 0, denied.stderr
        assert "askme ran" not in output
        assert "end" in output
        log = m.log()
        assert "refused a connection" in log if mode == "off" else True
        assert [_rules(d) for d in rules_dirs] == before  # `always` wrote nothing

    asyncio.run(scenario())
