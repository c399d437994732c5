"""Codex interop: `codex/sandbox-state/update` maps Codex's sandbox policy onto execgate's
profiles, and the wire format is the one Codex's client reads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any, Literal

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcpharness import WS, Mcp, PipeLines, error_text, payload, shell_args


class SandboxStateUpdate(types.Request[dict[str, Any], Literal["codex/sandbox-state/update"]]):
    method: Literal["codex/sandbox-state/update"] = "codex/sandbox-state/update"
    params: dict[str, Any]


def _write_probe(mcp: Mcp) -> str:
    return (
        f"echo a > {mcp.work}/w; echo work=$?; echo b > {mcp.outside}/o; echo outside=$?; "
        f"echo c > {mcp.root}/extra/e; echo extra=$?"
    )


def _verdicts(output: str) -> dict[str, str]:
    return dict(line.split("=") for line in output.splitlines() if "=" in line and " " not in line)


def test_sandbox_state_update_maps_codex_policies(mcp: Mcp) -> None:
    (mcp.root / "extra").mkdir()

    async def update(client: Any, params: dict[str, Any]) -> None:
        await client.session.send_request(SandboxStateUpdate(params=params), types.EmptyResult)

    async def writes(client: Any) -> dict[str, str]:
        data = payload(await client.call_tool("shell", shell_args(mcp, _write_probe(mcp))))
        return _verdicts(data["output"])

    async def scenario() -> None:
        extra = str(mcp.root / "extra")
        async with mcp.client(*WS, "--writable-root", extra) as client:
            # before any update: the configured profile (the workspace and --writable-root)
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "0"}
            # newer Codex clients may send the state with each call instead
            per_call = {"sandboxPolicy": {"type": "danger-full-access"}, "sandboxCwd": "/"}
            result = await client.call_tool(
                "shell",
                shell_args(mcp, _write_probe(mcp)),
                meta={"codex/sandbox-state-meta": per_call},
            )
            assert _verdicts(payload(result)["output"]) == {
                "work": "0",
                "outside": "0",
                "extra": "0",
            }
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "0"}
            await update(client, {"sandboxPolicy": {"type": "danger-full-access"},
                                  "sandboxCwd": str(mcp.work)})  # fmt: skip
            assert await writes(client) == {"work": "0", "outside": "0", "extra": "0"}
            await update(client, {"sandboxPolicy": {"type": "read-only"},
                                  "sandboxCwd": str(mcp.work)})  # fmt: skip
            assert await writes(client) == {"work": "1", "outside": "1", "extra": "1"}
            # the next call, with no update between: the same sandbox (made once per update)
            assert await writes(client) == {"work": "1", "outside": "1", "extra": "1"}
            await update(
                client,
                {
                    "sandboxPolicy": {
                        "type": "workspace-write",
                        "writable_roots": [str(mcp.root / "extra")],
                        "network_access": False,
                        "exclude_tmpdir_env_var": True,
                        "exclude_slash_tmp": True,
                    },
                    "sandboxCwd": str(mcp.work),
                    "codexLinuxSandboxExe": None,
                },
            )
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "0"}
            # the client narrows what is writable, never widens it past the server's bounds:
            # `outside` goes, `/` is cut to the bounds (the workspace, --writable-root)
            await update(
                client,
                {
                    "sandboxPolicy": {"type": "workspace-write", "writable_roots": [
                        str(mcp.outside), "/"], "exclude_slash_tmp": True},
                    "sandboxCwd": str(mcp.work),
                },
            )  # fmt: skip
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "0"}
            await update(
                client,
                {
                    "sandboxPolicy": {"type": "workspace-write", "writable_roots": [
                        str(mcp.outside)], "exclude_slash_tmp": True},
                    "sandboxCwd": str(mcp.work),
                },
            )  # fmt: skip
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "1"}
            # Codex's errors for bad requests
            with pytest.raises(MCPError) as raised:
                await update(client, {"sandboxPolicy": {"type": "Bogus"}, "sandboxCwd": "/"})
            assert raised.value.error.code == -32602
            assert raised.value.error.message == "failed to deserialize sandbox state"
            with pytest.raises(MCPError) as raised:
                await update(client, {"sandbox_policy": {"type": "read-only"}, "sandbox_cwd": "/"})
            assert raised.value.error.message == "failed to deserialize sandbox state"
            with pytest.raises(MCPError) as raised:
                await update(client, {})
            assert raised.value.error.message == "missing params for sandbox state request"
            # a rejected update changed nothing
            assert await writes(client) == {"work": "0", "outside": "1", "extra": "1"}
            # the request may carry a permissionProfile too; one that cannot be enforced is
            # rejected like a bad policy
            root = {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"}
            fs = {"type": "restricted", "entries": [root]}
            read_only = {"type": "managed", "network": "restricted", "file_system": fs}
            cwd = f"file://{mcp.work}"
            await update(client, {"permissionProfile": read_only, "sandboxCwd": cwd})
            assert await writes(client) == {"work": "1", "outside": "1", "extra": "1"}
            with pytest.raises(MCPError) as raised:
                await update(client, {"permissionProfile": {"type": "managed"}, "sandboxCwd": cwd})
            assert raised.value.error.message == "failed to deserialize sandbox state"

    asyncio.run(scenario())


def test_raw_wire_exchange_as_codex_sends_it(mcp: Mcp) -> None:
    """Byte-level check of what a Codex client sends and reads (protocol 2025-06-18, no client
    capabilities, the sandbox state first)."""
    messages = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "codex-mcp-client", "version": "0.97.0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "codex/sandbox-state/update",
         "params": {"sandboxPolicy": {"type": "danger-full-access"}, "sandboxCwd": str(mcp.work)}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "shell", "arguments": {"command": "printf 'a\\0b'; echo e >&2; exit 3",
                                                   "workdir": str(mcp.work), "login": False}}},
        # a prompt: Codex declares no elicitation capability but answers elicitation requests
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "shell", "arguments": {"command": "askme yes",
                                                   "workdir": str(mcp.work), "login": False}}},
        # under `codex exec` (its turn metadata says so), Codex declines without asking anyone
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "shell", "_meta": {"x-codex-turn-metadata": {"turn_trigger": "exec"}},
                    "arguments": {"command": "askme no", "workdir": str(mcp.work),
                                  "login": False}}},
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, *mcp.server_args()],
        env=mcp.env,
        cwd=mcp.work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin and process.stdout
    replies: dict[int, dict[str, Any]] = {}
    raw: dict[int, bytes] = {}
    elicitations: list[dict[str, Any]] = []
    for message in messages:
        process.stdin.write(json.dumps(message).encode() + b"\n")
        process.stdin.flush()
        if "id" not in message:
            continue
        while message["id"] not in replies:
            line = process.stdout.readline()
            assert line, "server closed stdout"
            reply = json.loads(line)
            if reply.get("method") == "elicitation/create":  # as Codex: accept {}, then decline
                elicitations.append(reply["params"])
                result = (
                    {"action": "accept", "content": {}}
                    if message["id"] == 3
                    else {"action": "decline"}
                )
                answer = {"jsonrpc": "2.0", "id": reply["id"], "result": result}  # fmt: skip
                process.stdin.write(json.dumps(answer).encode() + b"\n")
                process.stdin.flush()
            elif "id" in reply:
                replies[reply["id"]] = reply
                raw[reply["id"]] = line
    process.stdin.close()
    assert process.wait(timeout=60) == 0

    init = replies[0]["result"]
    assert init["protocolVersion"] == "2025-06-18"
    assert init["capabilities"]["experimental"] == {"codex/sandbox-state": {"version": "1.0.0"}}
    assert init["capabilities"]["tools"] == {"listChanged": False}
    assert replies[1]["result"] == {}
    result = replies[2]["result"]
    assert result["isError"] is False
    [item] = result["content"]
    assert item["type"] == "text"
    text = item["text"]
    assert text.startswith('{"exit_code":3,"output":"a\\u0000be\\n","duration":{"secs":0,"nanos":')
    assert text.endswith('},"timed_out":false}')
    assert result["structuredContent"]["output"] == "a\x00be\n"
    assert b'"structuredContent"' in raw[2]
    asked, _ = elicitations
    assert "/bin/askme yes` requires approval" in asked["message"]
    # one field, so that Codex's TUI submits the form with one key
    assert list(asked["requestedSchema"]["properties"]) == ["decision"]
    assert asked["requestedSchema"]["properties"]["decision"]["enum"][0] == "once"
    assert json.loads(replies[3]["result"]["content"][0]["text"])["output"] == "askme ran:yes\n"
    declined = json.loads(replies[4]["result"]["content"][0]["text"])["output"]
    assert "the client declined without showing the question (codex exec" in declined
    assert "by the user" not in declined


# -- Codex 0.169: the state in every call's _meta (permissionProfile) ------------------------------


def _profile(
    mcp: Mcp, entries: list[dict[str, Any]], network: str = "restricted"
) -> dict[str, Any]:
    profile = {
        "type": "managed",
        "file_system": {"type": "restricted", "entries": entries},
        "network": network,
    }
    return {
        "permissionProfile": profile,
        "sandboxCwd": f"file://{mcp.work}",
        "codexLinuxSandboxExe": "/nonexistent/codex-linux-sandbox",
        "useLegacyLandlock": False,
    }


def _entry(path: str, access: str) -> dict[str, Any]:
    if path.startswith(":"):
        return {"path": {"type": "special", "value": {"kind": path[1:]}}, "access": access}
    return {"path": {"type": "path", "path": path}, "access": access}


def test_permission_profile_in_each_call(mcp: Mcp) -> None:
    """What Codex 0.169 sends with every call is what the call gets: read-only, workspace-write
    with read-only subfolders, hidden folders, everything writable cut to the server's bounds;
    a state that cannot be enforced exactly is refused and nothing runs."""
    (mcp.root / "extra").mkdir()
    (mcp.work / ".agents").mkdir()
    secret = mcp.root / "secret"
    secret.mkdir()
    (secret / "key").write_text("hunter2")
    ws = [
        _entry(":root", "read"),
        _entry(str(mcp.work), "write"),
        _entry(f"{mcp.work}/.agents", "read"),
        _entry(str(secret), "none"),
    ]
    probe = (
        _write_probe(mcp)
        + f"; echo d > {mcp.work}/.agents/d; echo agents=$?; "
        + (f"cat {secret}/key; r=$?; echo; echo secret=$r")
    )

    async def call(state: dict[str, Any], *both: str) -> Any:
        keys = both or ("codex/sandbox-state",)
        return await client.call_tool(
            "shell", shell_args(mcp, probe), meta={k: state for k in keys}
        )

    async def scenario() -> None:
        nonlocal client
        async with mcp.client(*WS, "--writable-root", str(mcp.root / "extra")) as client:
            ro = _verdicts(payload(await call(_profile(mcp, [_entry(":root", "read")])))["output"])
            assert ro == {"work": "1", "outside": "1", "extra": "1", "agents": "1", "secret": "0"}
            got = payload(
                await call(_profile(mcp, ws), "codex/sandbox-state", "codex/sandbox-state-meta")
            )
            assert _verdicts(got["output"]) == {
                "work": "0",
                "outside": "1",
                "extra": "1",
                "agents": "1",
                "secret": "1",
            }
            assert "hunter2" not in got["output"]
            everything = {
                "permissionProfile": {
                    "type": "managed",
                    "network": "restricted",
                    "file_system": {"type": "unrestricted"},
                },
                "sandboxCwd": f"file://{mcp.work}",
            }
            got = payload(await call(everything))
            assert _verdicts(got["output"])["outside"] == "1"  # cut to the bounds
            assert _verdicts(got["output"])["extra"] == "0"
            # refused, naming what cannot be mapped; nothing ran
            glob = {"path": {"type": "glob_pattern", "pattern": "**/.env"}, "access": "none"}
            refused = await call(_profile(mcp, [_entry(":root", "read"), glob]))
            assert "cannot use the client's sandbox state" in error_text(refused)
            assert "glob pattern '**/.env' with access 'none'" in error_text(refused)
            mixed = await client.call_tool(
                "shell",
                shell_args(mcp, probe),
                meta={
                    "codex/sandbox-state": _profile(mcp, ws),
                    "codex/sandbox-state-meta": _profile(mcp, [_entry(":root", "read")]),
                },
            )
            assert "different sandbox states" in error_text(mixed)
            assert not (mcp.work / "w").exists() or (mcp.work / "w").read_text() == "a\n"
        log = mcp.log()
        assert "sandbox from the client's permissionProfile (_meta codex/sandbox-state)" in log
        assert "_meta codex/sandbox-state / codex/sandbox-state-meta" in log
        assert "cut to the workspace and --writable-root" in log

    client: Any = None
    asyncio.run(scenario())


def test_permission_profile_unprivileged(unprivileged: Any) -> None:
    """The same over raw stdio as an ordinary user: read-only holds, a refused state runs
    nothing."""
    folder = unprivileged.make_dir()
    work = folder / "work"
    work.mkdir()
    (folder / "empty.rules").write_text("")
    unprivileged.chown_tree(folder)
    server = subprocess.Popen(
        unprivileged.argv(
            [sys.executable, "-m", "execgate", "mcp", "--rules", str(folder / "empty.rules")]
        ),
        env=unprivileged.env(),
        cwd=work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None and server.stdout is not None
    state = {
        "permissionProfile": {
            "type": "managed",
            "network": "restricted",
            "file_system": {"type": "restricted", "entries": [_entry(":root", "read")]},
        },
        "sandboxCwd": f"file://{work}",
    }
    bad = {
        **state,
        "permissionProfile": {
            "type": "managed",
            "network": "restricted",
            "file_system": {"type": "restricted", "entries": [_entry(str(work), "write")]},
        },
    }
    command = f"echo x > {work}/f; echo rc=$?"
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "codex-mcp-client", "version": "0.169.0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *(
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {
                    "name": "shell",
                    "_meta": {"codex/sandbox-state": s},
                    "arguments": {"command": command, "workdir": str(work), "login": False},
                },
            }
            for i, s in ((2, state), (3, bad))
        ),
    ]
    replies: dict[int, Any] = {}
    lines = PipeLines(server.stdout)
    try:
        for message in messages:
            server.stdin.write(json.dumps(message).encode() + b"\n")
            server.stdin.flush()
            while "id" in message and message["id"] not in replies:
                reply = lines.message()
                replies[reply.get("id")] = reply
    finally:
        server.stdin.close()
        assert server.wait(timeout=60) == 0
        server.stdout.close()
    output = json.loads(replies[2]["result"]["content"][0]["text"])["output"]
    assert "rc=1" in output and not (work / "f").exists()
    assert replies[3]["result"]["isError"] is True
    assert "no `:root` read entry" in replies[3]["result"]["content"][0]["text"]
