"""The `shell` tool itself: schema, result format, output handling, bad arguments, start-up."""

from __future__ import annotations

import asyncio
import json

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcpharness import EXECGATE, WS, Mcp, error_text, payload, run_python, shell_args

CODEX_PROPERTIES = {
    "command": {"description": "The bash string to execute.", "type": "string"},
    "workdir": {
        "description": "The working directory to execute the command in. Must be an absolute path.",
        "type": "string",
    },
    "timeout_ms": {
        "description": "The timeout for the command in milliseconds.",
        "format": "uint64",
        "minimum": 0,
    },
    "login": {"description": "Launch Bash with -lc instead of -c: defaults to true."},
}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_tools_list_publishes_codex_schema_and_an_output_schema(mcp: Mcp, mode: str) -> None:
    async def scenario() -> None:
        async with mcp.client(mode=mode) as client:
            tools = (await client.list_tools()).tools
            if mode == "legacy":
                assert client.protocol_version == "2025-11-25"
                caps = client.server_capabilities
                assert caps.experimental == {"codex/sandbox-state": {"version": "1.0.0"}}
                assert client.server_info is not None
                assert client.server_info.name == "execgate"
                assert client.instructions and "shell commands" in client.instructions
            else:
                assert client.protocol_version == "2026-07-28"
        assert [t.name for t in tools] == ["shell"]
        tool = tools[0]
        assert tool.description == (
            "Runs a shell command and returns its output. "
            "You MUST provide the workdir as an absolute path."
        )
        schema = tool.input_schema
        assert schema["title"] == "ExecParams"
        assert schema["type"] == "object"
        assert schema["required"] == ["command", "workdir"]
        # Codex's four, then the permission request arguments
        assert list(schema["properties"])[:4] == ["command", "workdir", "timeout_ms", "login"]
        assert set(list(schema["properties"])[4:]) == {
            "sandbox_permissions",
            "justification",
            "additional_permissions",
            "prefix_rule",
        }
        for name, expected in CODEX_PROPERTIES.items():
            for key, value in expected.items():
                assert schema["properties"][name][key] == value, (name, key)
        assert schema["properties"]["timeout_ms"]["type"] == ["integer", "null"]
        assert schema["properties"]["login"]["type"] == ["boolean", "null"]
        output = tool.output_schema
        assert output is not None
        assert output["required"] == ["exit_code", "output", "duration", "timed_out"]
        assert "truncated_bytes" in output["properties"]

    asyncio.run(scenario())


def test_result_is_codex_json_with_interleaved_output(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            script = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3"
            result = await client.call_tool("shell", shell_args(mcp, script))
            data = payload(result)
            assert data["exit_code"] == 3
            assert data["output"] == "out1\nerr1\nout2\nerr2\n"  # in the order written
            assert data["timed_out"] is False
            assert set(data["duration"]) == {"secs", "nanos"}
            assert data["duration"]["secs"] < 10
            assert 0 <= data["duration"]["nanos"] < 1_000_000_000
            assert result.structured_content == {**data, "truncated_bytes": 0}
            text = result.content[0]
            assert isinstance(text, types.TextContent)
            assert text.text.startswith('{"exit_code":3,"output":"out1\\nerr1')  # compact, ordered
            # invalid UTF-8 becomes U+FFFD; non-ASCII text stays as it is
            result = await client.call_tool("shell", shell_args(mcp, r"printf '\377\376ok é\n'"))
            assert payload(result)["output"] == "\ufffd\ufffdok é\n"
            # the working directory and a signal death
            result = await client.call_tool("shell", shell_args(mcp, "pwd; kill -TERM $$"))
            data = payload(result)
            assert data["output"] == f"{mcp.work}\n"
            assert data["exit_code"] == 128 + 15

    asyncio.run(scenario())


def test_output_is_capped_with_head_tail_and_a_marker(mcp: Mcp) -> None:
    async def scenario() -> None:
        async with mcp.client() as client:
            # 3,000,000 bytes: "000000\n000001\n..." lines of 7 bytes (+1 partial at the end)
            script = "seq -f '%06g' 0 499999 | head -c 3000000; echo; echo END"
            result = await client.call_tool("shell", shell_args(mcp, script))
            data = payload(result)
            assert result.structured_content is not None
            cut = result.structured_content["truncated_bytes"]
            assert cut == 3_000_000 + len("\nEND\n") - (1 << 20)  # all ASCII: no boundary trim
            output = data["output"]
            assert output.startswith("000000\n000001\n")
            assert output.endswith("\nEND\n")
            marker = f"\n[... execgate: {cut} bytes of output cut here; the output is capped at "
            assert marker in output
            assert output.count("execgate:") == 1
            head, _, rest = output.partition(marker)
            assert len(head) == 1 << 19
            assert len(rest.split("...]\n", 1)[1]) == 1 << 19

    asyncio.run(scenario())


def test_login_shell_by_default_and_plain_when_asked(mcp: Mcp) -> None:
    probe = "shopt -q login_shell && echo login || echo plain"

    async def scenario() -> None:
        async with mcp.client() as client:
            result = await client.call_tool("shell", {"command": probe, "workdir": str(mcp.work)})
            assert payload(result)["output"] == "login\n"
            result = await client.call_tool("shell", shell_args(mcp, probe, login=False))
            assert payload(result)["output"] == "plain\n"
            result = await client.call_tool("shell", shell_args(mcp, probe, login=None))
            assert payload(result)["output"] == "login\n"
        async with mcp.client("--no-login") as client:
            result = await client.call_tool("shell", {"command": probe, "workdir": str(mcp.work)})
            assert payload(result)["output"] == "plain\n"
            result = await client.call_tool("shell", shell_args(mcp, probe, login=True))
            assert payload(result)["output"] == "login\n"

    asyncio.run(scenario())


def test_bad_arguments_are_tool_errors_not_protocol_errors(mcp: Mcp) -> None:
    missing = mcp.root / "missing"
    cases = [
        ({"command": "true"}, "`workdir` is required"),
        ({"command": "true", "workdir": "work"}, "`workdir` must be an absolute path"),
        ({"command": "true", "workdir": str(missing)}, f"`workdir` {missing} does not exist"),
        ({"command": "true", "workdir": str(mcp.rules)}, "is not a directory"),
        ({"workdir": str(mcp.work)}, "`command` is required"),
        ({"command": 7, "workdir": str(mcp.work)}, "`command` must be a string"),
        ({"command": "true", "workdir": str(mcp.work), "timeout_ms": "5"}, "`timeout_ms` must"),
        ({"command": "true", "workdir": str(mcp.work), "timeout_ms": -1}, "at least 1"),
        ({"command": "true", "workdir": str(mcp.work), "timeout_ms": 1.5}, "whole number"),
        ({"command": "true", "workdir": str(mcp.work), "login": "yes"}, "`login` must be"),
    ]

    async def scenario() -> None:
        async with mcp.client() as client:
            for arguments, expected in cases:
                result = await client.call_tool("shell", arguments)
                assert expected in error_text(result), (arguments, error_text(result))
            with pytest.raises(MCPError) as raised:
                await client.call_tool("nope", {})
            assert raised.value.error.code == -32602
            # the server still serves
            result = await client.call_tool("shell", shell_args(mcp, "echo ok", timeout_ms=5000.0))
            assert payload(result)["output"] == "ok\n"

    asyncio.run(scenario())


def test_concurrent_calls_run_in_parallel(mcp: Mcp) -> None:
    """Call A waits for a file only call B creates: serialized calls would time out."""

    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            flag = mcp.work / "flag"
            waiter = shell_args(
                mcp, f"while [ ! -e {flag} ]; do sleep 0.02; done; echo A", timeout_ms=60_000
            )
            a = asyncio.ensure_future(client.call_tool("shell", waiter))
            b = asyncio.ensure_future(
                client.call_tool("shell", shell_args(mcp, "touch flag; echo B"))
            )
            results = await asyncio.gather(a, b)
            assert [payload(r)["output"] for r in results] == ["A\n", "B\n"]

    asyncio.run(scenario())


def test_progress_notifications_stream_the_output(mcp: Mcp) -> None:
    """The command only goes on once the client has seen its first line as progress."""
    go = mcp.work / "go"

    async def scenario() -> None:
        chunks: list[tuple[float, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            chunks.append((value, message))
            if message and "line1" in message:
                go.touch()

        async with mcp.client() as client:
            script = f"echo line1; while [ ! -e {go} ]; do sleep 0.02; done; echo line2; echo line3"
            result = await client.call_tool(
                "shell", shell_args(mcp, script, timeout_ms=120_000), progress_callback=progress
            )
        output = payload(result)["output"]
        assert output == "line1\nline2\nline3\n"
        assert "".join(m or "" for _, m in chunks) == output
        assert chunks[0] == (6.0, "line1\n")  # streamed while running, not once at the end
        values = [v for v, _ in chunks]
        assert values == sorted(values) and values[-1] == len(output)

    asyncio.run(scenario())


def test_bad_rules_file_stops_start_up_with_one_line(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["git"], decision="deny")\n')
    result = run_python(["mcp", "--rules", str(mcp.rules)], env=mcp.env, input="", timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"execgate: error: {mcp.rules}:1:1: invalid decision: deny", lines
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # nothing on the protocol channel


def test_server_exits_when_the_client_closes_stdin(mcp: Mcp) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    result = run_python(
        ["mcp", *mcp.server_args()[3:]],
        env=mcp.env,
        input=json.dumps(message) + "\n",
        timeout=60,
        cwd=mcp.work,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.splitlines()[0])
    assert reply["result"]["protocolVersion"] == "2025-06-18"
    assert reply["result"]["capabilities"]["experimental"] == {
        "codex/sandbox-state": {"version": "1.0.0"}
    }
    assert EXECGATE  # (the CLI under test)
