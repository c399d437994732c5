"""``prompt`` for a host: asked through the exec prompts' channels (the terminal, MCP
elicitation), answered once / for the session / always, declined."""

from __future__ import annotations

import asyncio
import re

import mcp_types as types
from mcpharness import Elicitations, Mcp, accept, payload, shell_args
from netservers import Servers
from proxyharness import RULES, Proxied

from gate.test_run_terminal import Terminal


def test_terminal_decline_then_session_then_always(proxied_root: Proxied) -> None:
    p = proxied_root
    port = p.servers.http_port
    # The user's own layer (so "always" can be offered and written there).
    user_rules = p.home / "rules" / "default.rules"
    user_rules.parent.mkdir()
    user_rules.write_text(RULES)
    url = f"http://ask.test:{port}"
    script = f"curl -sS {url}/1; echo rc=$?; curl -sS {url}/2; curl -sS {url}/3"
    term = Terminal(p.argv(script, rules=False), p.env, p.work)
    term.expect(rb"network access to ask\.test port \d+ \(http\) requires approval: ask first")
    term.expect(rb"address: 127\.0\.0\.1")
    term.expect(rb"by: +curl -sS http://ask\.test:\d+/1")
    term.expect(rb"rule: +network_rule\(\"ask\.test\", \"http\", \"prompt\"\) at ")
    term.expect(rb"\[a\]lways")
    term.type(b"d\n")
    term.expect(rb"network access to ask\.test port \d+ \(http\) denied: declined at the terminal")
    term.expect(rb"rc=0")
    term.expect(rb"Allow\?")
    term.type(b"a\n")
    term.expect(rb"hello ask\.test:\d+ /2\r\n")
    term.expect(rb"hello ask\.test:\d+ /3\r\n")  # not asked again
    assert b"Allow?" not in term.screen
    assert term.finish() == 0
    assert 'network_rule(host="ask.test", protocol="http", decision="allow")' in (
        user_rules.read_text().splitlines()
    )
    # A new session: the rule written by "always" answers the prompt.
    again = p.run(f"curl -sS {url}/4", rules=False)
    assert re.match(r"hello ask\.test:\d+ /4\n", again.stdout), again


def _mcp_world(mcp: Mcp, servers: Servers) -> None:
    mcp.write_rules(RULES)
    (mcp.root / "execgate-home" / "config.toml").write_text(
        f'[network]\nhosts_file = "{servers.hosts_file}"\n'
    )


def test_mcp_elicits_a_prompted_host_accept_and_decline(mcp: Mcp, servers: Servers) -> None:
    """No --network flag: network rules in force make the proxy workspace-write's default."""
    _mcp_world(mcp, servers)
    answers = Elicitations([accept("once"), types.ElicitResult(action="decline")])
    url = f"http://ask.test:{servers.http_port}"

    async def scenario() -> None:
        async with mcp.client(elicit=answers) as client:
            first = payload(await client.call_tool("shell", shell_args(mcp, f"curl -sS {url}/a")))
            second = payload(
                await client.call_tool("shell", shell_args(mcp, f"curl -sS {url}/b; echo"))
            )
        assert first["output"] == f"hello ask.test:{servers.http_port} /a\n"
        assert second["output"] == (
            f"execgate: network access to ask.test port {servers.http_port} (http) denied: "
            "declined by the user\n\n"
        )

    asyncio.run(scenario())
    asked = answers.asked[0]
    assert f"network access to ask.test port {servers.http_port} (http) requires approval" in (
        asked.message
    )
    assert f"by:      curl -sS {url}/a" in asked.message
    assert "asked by the agent's shell command" in asked.message


def test_execgate_approvals_answers_a_prompted_host(mcp: Mcp, servers: Servers) -> None:
    """A client that cannot ask: the question waits in `execgate approvals`."""
    _mcp_world(mcp, servers)
    url = f"http://ask.test:{servers.http_port}"

    async def scenario() -> None:
        async with mcp.client() as client:
            call = asyncio.ensure_future(
                client.call_tool("shell", shell_args(mcp, f"curl -sS {url}/c"))
            )
            [pending] = await asyncio.to_thread(mcp.wait_for, mcp.pending, "a pending approval")
            assert pending["network"]["host"] == "ask.test"
            assert pending["network"]["addresses"] == ["127.0.0.1"]
            listing = await asyncio.to_thread(mcp.approvals, "list")
            assert f"network access to ask.test port {servers.http_port} (http)" in listing.stdout
            assert f"by:      curl -sS {url}/c" in listing.stdout
            answered = await asyncio.to_thread(mcp.approvals, "allow", str(pending["id"]))
            assert answered.returncode == 0, answered.stderr
            data = payload(await call)
        assert data["output"] == f"hello ask.test:{servers.http_port} /c\n"

    asyncio.run(scenario())
