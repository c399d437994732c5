"""The server's own JSON-RPC over stdio (no MCP SDK in the server): the first answer comes while
the server starts, yet nothing runs before the policy is loaded; a client that pipelines
everything gets every answer; the server process never imports the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mcpharness import Mcp, PipeLines, shell_args

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _call(request_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": "shell", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _serve(mcp: Mcp, *options: str, python: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *python, *mcp.server_args(*options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=mcp.env,
        cwd=mcp.work,
    )


def _answers(server: subprocess.Popen[bytes], count: int) -> list[dict[str, Any]]:
    lines = PipeLines(server.stdout)
    answers: list[dict[str, Any]] = []
    while len(answers) < count:
        line = lines.next(timeout=60)
        assert line, f"the server closed its output; got {answers}"
        answers.append(json.loads(line))
    return answers


def _by_id(answers: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    return {a.get("id"): a for a in answers}


def test_a_rules_file_that_does_not_load_runs_nothing(mcp: Mcp) -> None:
    """The client is answered before the policy loads; a tool call pipelined right behind the
    handshake must still never run when the policy then fails: the server exits 1 with the
    rules file's one line, and the call's marker is never written."""
    mcp.write_rules('prefix_rule(["git"], decision="deny")\n')
    marker = mcp.work / "ran"
    server = _serve(mcp)
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    server.stdin.write(
        _line(INIT) + _line(INITIALIZED) + _line(_call(2, shell_args(mcp, f"touch {marker}")))
    )
    server.stdin.flush()
    assert server.wait(timeout=60) == 1
    server.stdin.close()
    out = [json.loads(line) for line in server.stdout.read().splitlines()]
    assert [m.get("id") for m in out] in ([], [1]), out  # at most the handshake's answer
    err = server.stderr.read().decode()
    assert err.splitlines()[-1] == (
        f"execgate: error: {mcp.rules}:1:1: invalid decision: deny "
        "(valid decisions: allow, prompt, forbidden)"
    ), err
    assert "Traceback" not in err and not marker.exists()


def test_a_rules_file_that_does_not_load_runs_nothing_unprivileged(unprivileged: Any) -> None:
    """The same for an ordinary user's server (over raw stdio, its own home)."""
    folder = unprivileged.make_dir()
    work = folder / "work"
    work.mkdir()
    rules = folder / "bad.rules"
    rules.write_text('prefix_rule(["git"], decision="deny")\n')
    unprivileged.chown_tree(folder)
    marker = work / "ran"
    call = _call(2, {"command": f"touch {marker}", "workdir": str(work), "login": False})
    done = subprocess.run(
        unprivileged.argv([sys.executable, "-m", "execgate", "mcp", "--rules", str(rules)]),
        env=unprivileged.env(),
        cwd=work,
        input=_line(INIT) + _line(INITIALIZED) + _line(call),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert [json.loads(line).get("id") for line in done.stdout.splitlines()] in ([], [1])
    assert done.stderr.decode().splitlines()[-1].startswith(f"execgate: error: {rules}:1:1: ")
    assert not marker.exists()


def test_everything_pipelined_in_one_write_is_answered(mcp: Mcp) -> None:
    """A client that sends its whole conversation at once (handshake, a list, two calls, a ping,
    malformed lines) gets every answer: what the opening read and did not answer reaches the
    server intact, and a line that is no text is refused without harm to the rest."""
    server = _serve(mcp)
    assert server.stdin is not None
    conversation = [
        _line(INIT),
        _line(INITIALIZED),
        _line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        _line(_call(3, shell_args(mcp, "echo one"))),
        _line({"jsonrpc": "2.0", "id": "four", "method": "ping"}),
        b"{not json\n",
        # an escaped lone surrogate: JSON, but no text (a parse error, as the SDK answers it)
        _line(_call(5, shell_args(mcp, "echo \ud800"))),
        _line(_call(6, shell_args(mcp, "echo two"))),
    ]
    server.stdin.write(b"".join(conversation))
    server.stdin.flush()
    answers = _answers(server, 7)
    by_id = _by_id(answers)
    assert by_id[1]["result"]["serverInfo"]["name"] == "execgate"
    assert [t["name"] for t in by_id[2]["result"]["tools"]] == ["shell"]
    assert by_id[3]["result"]["structuredContent"]["output"] == "one\n"
    assert by_id["four"] == {"jsonrpc": "2.0", "id": "four", "result": {}}
    refused = [a["error"]["code"] for a in answers if a.get("id") is None]
    assert refused == [-32700, -32700], answers
    assert by_id[6]["result"]["structuredContent"]["output"] == "two\n"
    server.stdin.close()
    assert server.wait(timeout=60) == 0


def test_the_server_process_never_imports_the_mcp_sdk(mcp: Mcp) -> None:
    """The server answers, lists and runs a call without the SDK or pydantic in its process
    (their import alone outlasts the start-up goal); ``-X importtime`` lists every module the
    process imported, from every thread."""
    server = _serve(mcp, python=("-X", "importtime"))
    assert server.stdin is not None and server.stderr is not None
    server.stdin.write(_line(INIT) + _line(INITIALIZED) + _line(_call(2, shell_args(mcp, "true"))))
    server.stdin.flush()
    answers = _by_id(_answers(server, 2))
    assert answers[2]["result"]["isError"] is False
    server.stdin.close()
    assert server.wait(timeout=60) == 0
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in server.stderr.read().decode().splitlines()
        if line.startswith("import time:")
    }
    assert "execgate.mcp_front.server" in imported  # the listing is complete
    sdk = {m for m in imported if m.split(".")[0] in ("mcp", "mcp_types", "pydantic")}
    assert sdk == set(), sdk


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_client_that_stops_reading_stalls_the_server_without_spinning_or_losing_lines(
    mcp: Mcp,
) -> None:
    """A client that sends pings and reads no answer: once the server's output pipe is full,
    it stops reading its input (its reader no longer watched by the event loop: nobody reads
    it soon), so the loop sleeps instead of waking for a readable input at every turn
    (execgate/readable.py); when the client reads again, every ping is answered, in order."""
    server = _serve(mcp)
    assert server.stdin is not None and server.stdout is not None
    # (tools/list: answered by the server itself, not by the opening while it starts)
    listed = {"jsonrpc": "2.0", "id": "list", "method": "tools/list"}
    server.stdin.write(_line(INIT) + _line(INITIALIZED) + _line(listed))
    server.stdin.flush()
    lines = PipeLines(server.stdout)
    assert [json.loads(lines.next(timeout=60))["id"] for _ in range(2)] == [1, "list"]
    # Far more answers than the output pipe holds, and more pings than the input pipe holds.
    os.set_blocking(server.stdin.fileno(), False)
    sent, pending, refused = 0, b"", 0
    while refused < 200:  # two seconds of a full input pipe: the server waits for us
        if not pending:
            sent += 1
            pending = _line({"jsonrpc": "2.0", "id": 1 + sent, "method": "ping"})
        try:
            pending = pending[os.write(server.stdin.fileno(), pending) :]
            refused = 0
        except BlockingIOError:
            refused += 1
            time.sleep(0.01)
    # (an answer is 36-41 bytes: a full 64 KiB output pipe holds under 2000 of them)
    assert sent > 2000, "the server stopped reading before its output was full"
    time.sleep(0.5)  # (the server settles on its blocked write)
    before = _cpu_seconds(server.pid)
    time.sleep(1.0)
    assert _cpu_seconds(server.pid) - before < 0.3  # asleep, not spinning on its input
    os.set_blocking(server.stdin.fileno(), True)
    stdin = server.stdin

    def finish() -> None:  # (while we read: the server writes before it reads on)
        stdin.write(pending)
        stdin.close()

    writer = threading.Thread(target=finish)
    writer.start()
    ids = [json.loads(lines.next(timeout=60))["id"] for _ in range(sent)]
    writer.join()
    assert ids == list(range(2, 2 + sent))
    assert server.wait(timeout=60) == 0
