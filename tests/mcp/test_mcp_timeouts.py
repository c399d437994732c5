"""Timeouts and cancellation stop the whole tree of a call, escalated programs included, and
nothing a call started outlives it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import anyio
import pytest
from mcpharness import WS, Mcp, payload, shell_args

MODES = ["legacy", "auto"]


def _rules_allowing_the_sleeper(mcp: Mcp) -> None:
    # It lives outside the host's trusted PATH: host_executable says which file the name means
    # (an escalation needs a rule that names the very file that runs).
    mcp.write_rules(
        f'host_executable(name="{mcp.sleeper}", paths=["{mcp.bin / mcp.sleeper}"])\n'
        f'prefix_rule(["{mcp.sleeper}"], "allow")\n'
    )


def test_timeout_kills_everything_and_keeps_the_output(mcp: Mcp) -> None:
    _rules_allowing_the_sleeper(mcp)

    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            script = (
                f"echo before; {mcp.napper} 1000 & {mcp.sleeper} 1000 & "
                f"sh -c '{mcp.sleeper} 1000'; echo never"
            )
            started = time.monotonic()
            result = await client.call_tool("shell", shell_args(mcp, script, timeout_ms=1500))
            took = time.monotonic() - started
            data = payload(result)
            assert data["timed_out"] is True
            assert data["exit_code"] == 124
            assert data["output"] == "before\n"
            assert 1.5 <= data["duration"]["secs"] + data["duration"]["nanos"] / 1e9 < 10
            assert took < 10  # the reply is not held up by the cleanup
            # the result only comes once every process is gone: escalated, sandboxed, background
            assert mcp.leftovers() == []

    asyncio.run(scenario())
    # each escalation is recorded in the escalations log; stderr only counts them per call
    record = Path(mcp.env["EXECGATE_HOME"]) / "log" / "escalations.log"
    assert f"escalated {mcp.sleeper} 1000" in record.read_text()
    assert f"escalated {mcp.sleeper} 1000" not in mcp.log()
    assert "escalated" in mcp.log()  # the call's summary line: "…, 2 escalated"


def test_background_processes_end_with_the_call(mcp: Mcp) -> None:
    _rules_allowing_the_sleeper(mcp)

    async def scenario() -> None:
        async with mcp.client(*WS) as client:
            script = f"({mcp.napper} 1000 &) ; {mcp.sleeper} 1000 & echo started"
            data = payload(await client.call_tool("shell", shell_args(mcp, script)))
            # (the escalated sleeper may still be on its way when the shell ends: then it is
            # refused with an `execgate: cannot run ...` line instead of being started)
            assert data["output"].startswith("started\n")
            assert data["timed_out"] is False
            assert mcp.leftovers() == []

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", MODES)
def test_cancel_kills_the_tree_and_the_server_goes_on(mcp: Mcp, mode: str) -> None:
    _rules_allowing_the_sleeper(mcp)

    async def scenario() -> None:
        async with mcp.client(*WS, mode=mode) as client:
            with anyio.CancelScope() as scope:

                async def progress(value: float, total: float | None, message: str | None) -> None:
                    if message and "started" in message:
                        scope.cancel()  # the client gives up on the call: notifications/cancelled

                script = f"{mcp.napper} 1000 & {mcp.sleeper} 1000 & echo started; wait"
                await client.call_tool(
                    "shell", shell_args(mcp, script, timeout_ms=600_000), progress_callback=progress
                )
                raise AssertionError("the call was not cancelled")
            assert scope.cancelled_caught
            await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the cleanup")
            data = payload(await client.call_tool("shell", shell_args(mcp, "echo still here")))
            assert data["output"] == "still here\n"
            assert "aborted; stopping it" in mcp.log()  # the server saw the cancellation

    asyncio.run(scenario())


def test_client_going_away_stops_running_calls(mcp: Mcp) -> None:
    _rules_allowing_the_sleeper(mcp)

    async def scenario() -> None:
        started = asyncio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            if message and "started" in message:
                started.set()

        async with mcp.client(*WS) as client:
            script = f"{mcp.napper} 1000 & {mcp.sleeper} 1000 & echo started; wait"
            call = asyncio.ensure_future(
                client.call_tool(
                    "shell", shell_args(mcp, script, timeout_ms=600_000), progress_callback=progress
                )
            )
            await asyncio.wait_for(started.wait(), 60)
            call.cancel()
            # leaving the block closes the server's stdin
        await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the cleanup")

    asyncio.run(scenario())


def test_sigterm_stops_the_server_and_its_calls(mcp: Mcp) -> None:
    _rules_allowing_the_sleeper(mcp)

    async def scenario() -> None:
        started = asyncio.Event()

        async def progress(value: float, total: float | None, message: str | None) -> None:
            if message and "started" in message:
                started.set()

        with contextlib.suppress(Exception):
            async with mcp.client(*WS) as client:
                script = f"{mcp.napper} 1000 & {mcp.sleeper} 1000 & echo started; wait"
                call = asyncio.ensure_future(
                    client.call_tool(
                        "shell",
                        shell_args(mcp, script, timeout_ms=600_000),
                        progress_callback=progress,
                    )
                )
                await asyncio.wait_for(started.wait(), 60)
                listing = json.loads(
                    (await asyncio.to_thread(mcp.approvals, "list", "--json")).stdout
                )
                [server] = listing["servers"]
                os.kill(server["pid"], signal.SIGTERM)
                await asyncio.to_thread(mcp.wait_for, lambda: not mcp.leftovers(), "the cleanup")
                with contextlib.suppress(Exception):
                    await call
        run = mcp.root / "execgate-home" / "run"
        assert list(run.glob("mcp-*")) == []

    asyncio.run(scenario())
