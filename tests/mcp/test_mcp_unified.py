"""Unified exec (``exec_command`` / ``write_stdin``) end to end: the real ``execgate mcp`` driven
by the SDK's client over stdio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.client.client import Client
from mcpharness import WS, Elicitations, Mcp, PipeLines, accept, error_text

UNIFIED = ("--tools", "shell,unified")


def _allow_the_sleeper(mcp: Mcp) -> None:
    mcp.write_rules(
        f'host_executable(name="{mcp.sleeper}", paths=["{mcp.bin / mcp.sleeper}"])\n'
        f'prefix_rule(["{mcp.sleeper}"], "allow")\n'
        'prefix_rule(["askme"], "prompt", justification="askme needs a human")\n'
    )


def result_of(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    structured = result.structured_content
    assert isinstance(structured, dict)
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert text.text.splitlines()[0].startswith("Wall time: ")
    return structured


async def exec_command(client: Client, mcp: Mcp, cmd: str, **extra: Any) -> dict[str, Any]:
    arguments = {"cmd": cmd, "workdir": str(mcp.work), "login": False, **extra}
    return result_of(await client.call_tool("exec_command", arguments))


async def write_stdin(client: Client, session_id: int, chars: str, **extra: Any) -> dict[str, Any]:
    arguments = {"session_id": session_id, "chars": chars, **extra}
    return result_of(await client.call_tool("write_stdin", arguments))


async def until(client: Client, first: dict[str, Any], pattern: str, chars: str = "") -> str:
    """Output of ``first`` and further writes/polls until ``pattern`` shows (bounded)."""
    seen = first["output"]
    for _ in range(20):
        if re.search(pattern, seen) or "exit_code" in first:
            break
        first = await write_stdin(client, first["session_id"], chars, yield_time_ms=500)
        chars = ""
        seen += first["output"]
    return str(seen)


async def until_exit(client: Client, result: dict[str, Any]) -> tuple[int, str]:
    """(exit code, output seen) once the process of ``result`` has exited (bounded polls)."""
    seen = result["output"]
    for _ in range(20):
        if "exit_code" in result:
            return result["exit_code"], str(seen)
        result = await write_stdin(client, result["session_id"], "")
        seen += result["output"]
    raise AssertionError(f"still running: {seen!r}")


def test_tools_are_offered_only_when_asked_for(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["shell"]
        async with mcp.client(*UNIFIED) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert list(tools) == ["shell", "exec_command", "write_stdin"]
            assert tools["exec_command"].input_schema["required"] == ["cmd"]
            assert set(tools["write_stdin"].input_schema["properties"]) >= {
                "session_id",
                "chars",
                "yield_time_ms",
                "max_output_tokens",
            }

    asyncio.run(scenario())


def test_long_exec_polled_written_and_exited_with_pipes(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *WS) as client:
            env = await exec_command(
                client,
                mcp,
                "echo PAGER=$PAGER NO_COLOR=$NO_COLOR TERM=$TERM; [ -t 0 ] || echo pipe",
            )
            assert env["exit_code"] == 0 and "session_id" not in env
            assert "PAGER=cat NO_COLOR=1 TERM=dumb" in env["output"] and "pipe" in env["output"]
            script = "echo ready; read line; echo got:$line; read again; echo bye:$again; exit 3"
            first = await exec_command(client, mcp, script, yield_time_ms=300)
            sid = first["session_id"]
            assert "exit_code" not in first
            assert "ready" in await until(client, first, "ready")
            second = await write_stdin(client, sid, "hello\n", yield_time_ms=1000)
            assert "got:hello" in await until(client, second, "got:hello")
            last = await write_stdin(client, sid, "world\n", yield_time_ms=5000)
            code, seen = await until_exit(client, last)
            assert code == 3 and "bye:world" in seen
            gone = await client.call_tool("write_stdin", {"session_id": sid, "chars": ""})
            assert f"no unified exec session {sid}" in error_text(gone)
            # at most 1 MiB kept per process (head and tail); max_output_tokens cuts further
            big = "head -c 3000000 /dev/zero | tr '\\0' a; echo END"
            kept = await exec_command(client, mcp, big, max_output_tokens=1_000_000)
            assert kept["output"].rstrip().endswith("aEND")
            assert "bytes of output cut here" in kept["output"]
            assert 1 << 20 <= len(kept["output"]) < (1 << 20) + 1000
            cut = await exec_command(client, mcp, big, max_output_tokens=100)
            assert len(cut["output"]) < 600 and cut["original_token_count"] > 250_000
            # the model cannot confuse it with a denial: a denied program says so
            denied = await exec_command(client, mcp, "marker; echo status $?")
            assert "execgate: denied: marker" in denied["output"]
            assert "status 126" in denied["output"]

    asyncio.run(scenario())


def test_python_bash_password_and_ctrl_c_on_a_pty(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *WS) as client:
            py = await exec_command(client, mcp, "python3 -q -i", tty=True, yield_time_ms=1500)
            sid = py["session_id"]
            assert ">>>" in await until(client, py, ">>>")
            out = await write_stdin(client, sid, "print(6 * 7)\n", yield_time_ms=1000)
            assert "42" in await until(client, out, "42")
            out = await write_stdin(client, sid, "import time; time.sleep(30)\n")
            out = await write_stdin(client, sid, "\u0003", yield_time_ms=1000)
            assert "KeyboardInterrupt" in await until(client, out, "KeyboardInterrupt")
            out = await write_stdin(
                client, sid, "import os, sys; sys.exit(5)\n", yield_time_ms=5000
            )
            assert (await until_exit(client, out))[0] == 5

            script = (
                "[ -t 0 ] && echo tty; read -s -p 'Password: ' pw </dev/tty; echo; "
                'echo "length ${#pw}"; while read l; do echo "line:$l"; done'
            )
            sh = await exec_command(client, mcp, script, tty=True, yield_time_ms=1000)
            sid = sh["session_id"]
            assert "Password:" in await until(client, sh, "Password:")
            out = await write_stdin(client, sid, "secret\n", yield_time_ms=1000)
            seen = await until(client, out, "length 6")
            assert "length 6" in seen and "secret" not in seen  # not echoed
            out = await write_stdin(client, sid, "one\n", yield_time_ms=1000)
            assert "line:one" in await until(client, out, "line:one")
            out = await write_stdin(client, sid, "\u0004", yield_time_ms=5000)  # EOF
            assert (await until_exit(client, out))[0] == 0

    asyncio.run(scenario())


def test_prompts_answered_slower_than_the_yield_time(mcp: Mcp) -> None:
    async def slowly(answer: types.ElicitResult) -> Any:
        async def later() -> types.ElicitResult:
            await anyio.sleep(1.5)  # far beyond yield_time_ms
            return answer

        return later

    async def scenario() -> None:
        answers = Elicitations([await slowly(accept("once")), await slowly(accept(None))])
        answers.answers[1] = await slowly(types.ElicitResult(action="decline"))
        async with mcp.client(*UNIFIED, *WS, elicit=answers) as client:
            ok = await exec_command(client, mcp, "askme one; echo after", yield_time_ms=250)
            assert ok.get("exit_code") == 0, ok
            assert "askme ran:one" in ok["output"] and "after" in ok["output"]
            no = await exec_command(client, mcp, "askme two; echo after $?", yield_time_ms=250)
            assert no.get("exit_code") == 0, no
            assert "execgate: denied: askme two" in no["output"] and "after 126" in no["output"]
        assert len(answers.asked) == 2

    asyncio.run(scenario())


def _holders(inode: str) -> set[int]:
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        found.add(int(pid))
    return found


def _socket_inode(path: str) -> str:
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == path:
            return fields[6]
    raise AssertionError(f"no socket {path}")


def test_everything_ends_on_disconnect_and_on_stop_and_sockets_stay_home(mcp: Mcp) -> None:
    _allow_the_sleeper(mcp)
    # an escalated sleeper and a sandboxed napper, on pipes and on a PTY
    script = f"echo $EXECGATE_SOCKET; {mcp.sleeper} 1000 & {mcp.napper} 1000 & wait"

    async def start_both(client: Client) -> list[str]:
        sockets = []
        for tty in (False, True):
            first = await exec_command(client, mcp, script, tty=tty, yield_time_ms=500)
            seen = await until(client, first, r"gate\.sock")
            sockets.append(re.search(r"(\S+gate\.sock)", seen).group(1))  # type: ignore[union-attr]
        return sockets

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *WS) as client:
            sockets = await start_both(client)
            mcp.wait_for(lambda: len(mcp.leftovers()) >= 4, "the sleepers")
            # each gate socket is held by the server alone: no launcher, no process of the
            # other session, nothing unrelated
            holders = [_holders(_socket_inode(s)) for s in sockets]
            assert all(len(h) == 1 for h in holders), holders
            assert holders[0] == holders[1]
            (server,) = holders[0]
            assert "execgate" in Path(f"/proc/{server}/cmdline").read_text()
        await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the disconnect")

        with contextlib.suppress(Exception):
            async with mcp.client(*UNIFIED, *WS) as client:
                await start_both(client)
                mcp.wait_for(lambda: len(mcp.leftovers()) >= 4, "the sleepers")
                listing = json.loads(
                    (await asyncio.to_thread(mcp.approvals, "list", "--json")).stdout
                )
                [server] = listing["servers"]
                os.kill(server["pid"], signal.SIGTERM)
                await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the stop")

    asyncio.run(scenario())


def test_eviction_at_64_protects_the_recent_and_prefers_the_exited(mcp: Mcp) -> None:
    live = f"exec {mcp.napper} 1000"

    async def scenario() -> None:
        async with mcp.client(*UNIFIED, *WS) as client:
            oldest = (await exec_command(client, mcp, live, yield_time_ms=250))["session_id"]
            short = await exec_command(client, mcp, f"{mcp.napper} 0.5", yield_time_ms=250)
            exited_unread = short["session_id"]
            started: list[int] = []

            async def one() -> None:
                started.append(
                    (await exec_command(client, mcp, live, yield_time_ms=250))["session_id"]
                )

            async with anyio.create_task_group() as tasks:
                for _ in range(62):
                    tasks.start_soon(one)
            started.sort()
            # the oldest is used again: one of the 8 most recent, so protected
            await write_stdin(client, oldest, "x", yield_time_ms=250)
            # `short` exits (its exit is not read)
            await asyncio.to_thread(
                mcp.wait_for,
                lambda: not [p for p in mcp.leftovers() if p.endswith(" 0.5")],
                "the short session's exit",
            )
            # full: the exited one goes first
            await exec_command(client, mcp, live, yield_time_ms=250)
            gone = await client.call_tool(
                "write_stdin", {"session_id": exited_unread, "chars": "x"}
            )
            assert "no unified exec session" in error_text(gone)
            # then the least recently used live one, which is terminated
            await exec_command(client, mcp, live, yield_time_ms=250)
            gone = await client.call_tool("write_stdin", {"session_id": started[0], "chars": "x"})
            assert "no unified exec session" in error_text(gone)
            still = await write_stdin(client, oldest, "x", yield_time_ms=250)
            assert still["session_id"] == oldest
            assert len(mcp.leftovers()) == 64
        await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the disconnect")

    asyncio.run(scenario())


def test_pty_ctrl_c_and_disconnect_as_an_unprivileged_user(unprivileged: Any) -> None:
    """As an ordinary user, over raw stdio: the launcher takes the PTY as its terminal, Ctrl-C
    reaches the foreground job, and closing stdin leaves no process behind."""
    folder = unprivileged.make_dir()
    (folder / "empty.rules").write_text("")
    unprivileged.chown_tree(folder)
    tag = f"egtag{folder.name[-8:]}u"
    command = [sys.executable, "-m", "execgate", "mcp", "--tools", "unified"]
    server = subprocess.Popen(
        unprivileged.argv([*command, "--rules", str(folder / "empty.rules")]),
        env=unprivileged.env(),
        cwd=folder,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None and server.stdout is not None
    ids = iter(range(1, 100))
    lines = PipeLines(server.stdout)

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        assert server.stdin is not None and server.stdout is not None
        request = {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}}  # fmt: skip
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        answer = lines.message()
        structured: dict[str, Any] = answer["result"]["structuredContent"]
        return structured

    def survivors() -> list[str]:
        found = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True)
        return [line for line in found.stdout.splitlines() if "pgrep" not in line]

    try:
        assert server.stdin is not None and server.stdout is not None
        hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
        server.stdin.write(json.dumps(hello).encode() + b"\n")
        server.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        server.stdin.flush()
        lines.next()
        script = (
            f": {tag}; trap 'echo got-int' INT; echo ready; "
            f"(exec -a {tag}-bg sleep 1000) & while :; do sleep 0.2; done"
        )
        first = call("exec_command", {"cmd": script, "tty": True, "login": False,
                                      "workdir": str(folder), "yield_time_ms": 1000})  # fmt: skip
        seen, sid = first["output"], first["session_id"]
        for _ in range(10):
            if "ready" in seen:
                break
            seen += call("write_stdin", {"session_id": sid, "chars": "", "yield_time_ms": 5000})[
                "output"
            ]
        assert "ready" in seen
        seen = ""
        for chars in ("\u0003", "", "", ""):
            seen += call("write_stdin", {"session_id": sid, "chars": chars, "yield_time_ms": 1000})[
                "output"
            ]
            if "got-int" in seen:
                break
        assert "got-int" in seen
        assert survivors()
    finally:
        server.stdin.close()
        server.stdout.close()
        assert server.wait(timeout=60) == 0
    deadline = time.monotonic() + 30  # a failure guard: they are killed at once
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors() == []
