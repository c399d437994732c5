"""Round trip of the MCP ``shell`` tool against plain bash, measured in the same run.

Starts ``execgate mcp`` (isolated homes, no rules of the user's) and drives it with the MCP
SDK's client over stdio. For each command it takes the median wall time of a ``tools/call``
(request to result, as the agent sees it) and of ``bash -c COMMAND`` run directly, runs
interleaved, and prints both and their ratio:

* ``true`` -- a bash builtin, no exec: the fixed cost of a call (session, launcher, shell);
* a loop of 100 ``/bin/true`` -- 100 gated execs.

With ``--unified`` it also measures unified exec (``--tools shell,unified``):

* ``exec_command`` start to first output (``echo ready``; the process ends, so the result comes
  at once) against ``bash -c 'echo ready'``;
* ``write_stdin`` echo round trip: a line written to ``cat`` on a PTY until its echo comes back
  (the result comes once the answer has arrived and settled), against the same exchange with
  ``cat`` on a PTY of our own.

Usage: python bench/mcp_roundtrip.py [--runs N] [--sandbox MODE] [--login] [--mode legacy|auto]
                                    [--unified]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from build_overhead import isolated_env  # a sibling script (bench/ is sys.path[0])
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

COMMANDS = {
    "true": "true",
    "100 x /bin/true": "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done",
}


def plain_pty_echo(env: dict[str, str], runs: int) -> list[float]:
    """Write a line to ``cat`` on a PTY of our own; time until its echo is read back."""
    leader, follower = pty.openpty()
    cat = subprocess.Popen(["cat"], stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    timings = []
    try:
        for i in range(runs + 1):
            line = f"ping{i}\n".encode()
            started = time.perf_counter()
            os.write(leader, line)
            seen = b""
            while seen.count(f"ping{i}".encode()) < 2:  # the terminal's echo, then cat's
                select.select([leader], [], [], 5)
                seen += os.read(leader, 4096)
            timings.append(time.perf_counter() - started)
    finally:
        cat.kill()
        cat.wait()
        os.close(leader)
    return timings[1:]


async def measure_unified(
    client: Client, work: Path, env: dict[str, str], runs: int
) -> list[tuple[str, list[float], list[float]]]:
    arguments = {"workdir": str(work), "login": False}
    starts, plain_starts, echoes = [], [], []
    for i in range(runs + 1):
        started = time.perf_counter()
        result = await client.call_tool("exec_command", {**arguments, "cmd": "echo ready"})
        elapsed = time.perf_counter() - started
        assert result.structured_content is not None, result
        assert "ready" in result.structured_content["output"], result
        plain = plain_bash("echo ready", work, env, login=False)
        if i:
            starts.append(elapsed)
            plain_starts.append(plain)
    first = await client.call_tool(
        "exec_command", {**arguments, "cmd": "exec cat", "tty": True, "yield_time_ms": 250}
    )
    assert first.structured_content is not None, first
    session_id = first.structured_content["session_id"]
    for i in range(runs + 1):
        line = f"ping{i}\n"
        started = time.perf_counter()
        seen = ""
        while seen.count(f"ping{i}") < 2:  # the terminal's echo, then cat's
            result = await client.call_tool(
                "write_stdin", {"session_id": session_id, "chars": line, "yield_time_ms": 1000}
            )
            line = ""
            assert result.structured_content is not None, result
            seen += result.structured_content["output"]
        if i:
            echoes.append(time.perf_counter() - started)
    await client.call_tool("write_stdin", {"session_id": session_id, "chars": "\u0004"})
    return [
        ("exec_command to output", plain_starts, starts),
        ("write_stdin echo (PTY)", plain_pty_echo(env, runs), echoes),
    ]


def plain_bash(command: str, cwd: Path, env: dict[str, str], login: bool) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["bash", "-lc" if login else "-c", command],
        cwd=cwd,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


async def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="eg-bench-") as tmp:
        root = Path(tmp)
        work = root / "work"
        work.mkdir()
        env = isolated_env(root)
        rules = root / "bench.rules"
        rules.write_text('prefix_rule(["git", "push"], "prompt")\n')
        params = StdioServerParameters(
            command=sys.executable,
            args=[
                *("-m", "execgate", "mcp", "-q", "--rules", str(rules), "--sandbox", args.sandbox),
                *(("--tools", "shell,unified") if args.unified else ()),
            ],
            env=env,
            cwd=work,
        )
        unified: list[tuple[str, list[float], list[float]]] = []
        timings: dict[str, dict[str, list[float]]] = {
            name: {"plain": [], "mcp": []} for name in COMMANDS
        }
        with open(os.devnull, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode=args.mode) as client:
                arguments = {"workdir": str(work), "login": args.login}
                for command in COMMANDS.values():  # warm up both sides
                    await client.call_tool("shell", {**arguments, "command": command})
                    plain_bash(command, work, env, args.login)
                for _ in range(args.runs):
                    for name, command in COMMANDS.items():
                        started = time.perf_counter()
                        result = await client.call_tool("shell", {**arguments, "command": command})
                        timings[name]["mcp"].append(time.perf_counter() - started)
                        assert not result.is_error and result.structured_content is not None
                        assert result.structured_content["exit_code"] == 0, result
                        timings[name]["plain"].append(plain_bash(command, work, env, args.login))
                if args.unified:
                    unified = await measure_unified(client, work, env, args.runs)

    print(
        f"execgate mcp `shell` round trip vs plain bash (median of {args.runs}; protocol "
        f"{args.mode}; sandbox {args.sandbox}; {'login' if args.login else 'non-login'} shell)"
    )
    print(f"{'command':<18}{'plain bash':>12}{'execgate mcp':>15}{'ratio':>9}")
    medians: dict[str, tuple[float, float]] = {}
    for name, runs in timings.items():
        plain, gated = statistics.median(runs["plain"]), statistics.median(runs["mcp"])
        medians[name] = (plain, gated)
        print(f"{name:<18}{plain * 1e3:>9.2f} ms{gated * 1e3:>12.2f} ms{gated / plain:>8.2f}x")
    (plain_true, mcp_true), (plain_loop, mcp_loop) = medians.values()
    per_plain = (plain_loop - plain_true) / 100 * 1e6
    per_mcp = (mcp_loop - mcp_true) / 100 * 1e6
    print(
        f"per exec (loop minus `true`): plain {per_plain:.0f} us, gated {per_mcp:.0f} us "
        f"({per_mcp / per_plain:.2f}x)"
    )
    if unified:
        print(f"{'unified exec (medians)':<26}{'plain':>12}{'execgate mcp':>15}")
    for name, plain_runs, gated_runs in unified:
        plain, gated = statistics.median(plain_runs), statistics.median(gated_runs)
        print(f"{name:<26}{plain * 1e3:>9.2f} ms{gated * 1e3:>12.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--sandbox", default="workspace-write")
    parser.add_argument("--login", action="store_true", help="bash -lc (the tool's default)")
    parser.add_argument("--mode", choices=("legacy", "auto"), default="legacy")
    parser.add_argument("--unified", action="store_true", help="also measure unified exec")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
