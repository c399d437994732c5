"""A call is answered as soon as its shell's exit is known when nothing it started is left
(protocol §7 `ended`); a command that leaves anything behind, however it tries to slip out, gets
its answer only once all of it is gone."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcpharness import Mcp, RawServer, payload, shell_args

#: Left behind by the command, each ignoring SIGTERM (the end of the session then takes the
#: grace period and SIGKILL: an answer that came first would find them still running).
STAYS = {
    "a background job": "(trap '' TERM; exec -a {tag}-job sleep 1000) &",
    "a detached double fork": "(setsid bash -c \"trap '' TERM; exec -a {tag}-det sleep 1000\" &) &",
    # a chain that forks and exits without end: its pids keep changing, racing the shell's exit
    "a hopping chain": (
        "trap '' TERM; hop() {{ ( i=0; while [ $i -lt 100 ]; do i=$((i+1)); done; "
        'echo hop >> "{tag}-hops"; hop ) & }}; hop'
    ),
}


def _survivors(tag: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.parametrize("mode", ["off", "workspace-write"])
@pytest.mark.parametrize("stays", list(STAYS))
def test_nothing_the_call_started_runs_when_its_answer_comes(
    mcp: Mcp, stays: str, mode: str
) -> None:
    mcp.write_rules("")
    script = STAYS[stays].format(tag=mcp.tag) + "\necho left"
    hops = mcp.work / f"{mcp.tag}-hops"

    async def scenario() -> None:
        async with mcp.client("--sandbox", mode, "--exclude-tmp", "--exclude-tmpdir") as client:
            for _ in range(3):  # bounded attempts: the chain at other points of its hops
                data = payload(await client.call_tool("shell", shell_args(mcp, script)))
                assert data["output"] == "left\n" and data["exit_code"] == 0
                assert _survivors(mcp.tag) == []  # at once: the answer came after the kill
                size = hops.stat().st_size if hops.exists() else 0
                await asyncio.sleep(0.2)  # a survivor would hop (and write) meanwhile
                assert (hops.stat().st_size if hops.exists() else 0) == size
            # a call that leaves nothing is answered on the fast path, and the server goes on
            data = payload(await client.call_tool("shell", shell_args(mcp, "echo done")))
            assert data["output"] == "done\n"

    asyncio.run(scenario())


def test_a_call_that_leaves_nothing_is_answered_with_all_its_output(mcp: Mcp) -> None:
    """The early answer still has every byte the command wrote, its status, and the call's
    decisions are in the log when it comes."""
    mcp.write_rules("")

    log = Path(mcp.env["EXECGATE_HOME"]) / "log" / "decisions.jsonl"

    def programs() -> list[str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [r["argv"][0] for r in map(json.loads, lines) if r.get("kind") == "exec"]

    async def scenario() -> None:
        async with mcp.client("--sandbox", "off") as client:
            for _ in range(5):
                before = programs()
                script = "head -c 200000 /dev/zero | tr '\\0' x; echo; echo end >&2; exit 7"
                data = payload(await client.call_tool("shell", shell_args(mcp, script)))
                assert data["exit_code"] == 7
                assert data["output"] == "x" * 200000 + "\nend\n"
                # the shell's own decision (the others are the snapshot's, in the interposer)
                assert [Path(p).name for p in programs()[len(before) :]] == ["bash"]

    asyncio.run(scenario())


def test_nothing_left_runs_at_the_answer_unprivileged(unprivileged: Any) -> None:
    """The same attack as an ordinary user, over raw stdio."""
    folder = unprivileged.make_dir()
    tag = f"egtag{folder.name[-8:]}a"
    with RawServer(unprivileged, folder) as server:
        for stays in STAYS:
            command = STAYS[stays].format(tag=tag) + "\necho left"
            answer = server.shell(command=command, workdir=str(folder), login=False)
            assert answer["result"]["structuredContent"]["output"] == "left\n", answer
            assert _survivors(tag) == [], stays
