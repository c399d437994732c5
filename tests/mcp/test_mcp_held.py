"""`shell` calls in shells started ahead of them (gate/held.py): each call runs in a held shell
when it fits (its argv and environment are the call's, to the byte, in the shell and in /proc),
and in a shell spawned for it when it does not; sandboxed or not, and a gated program can never
ask for a hold."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from mcpharness import WS, Mcp, RawServer, payload, shell_args

from execgate.gate.held import COMMAND_ROOM

# How many NULs the shell's /proc/PID/cmdline has: one per argument (3) when spawned for the
# call, many more when held (the placeholder's room left over, zeroed).
NULS = '$(( $(wc -c < /proc/$$/cmdline) - $(tr -d "\\0" < /proc/$$/cmdline | wc -c) ))'
# (the length of "é": one character in the server's C.UTF-8, as in a shell spawned for the call)
PROBE = (
    'x=\u00e9; printf "%s\\n" "$0" "$PWD" "$(pwd -P)" "${EXECGATE_HOLD-unset}" '
    '"${EXECGATE_HOLD_ROOM-unset}" "$(tr "\\0" "\\n" < /proc/$$/cmdline | grep -c .)" '
    f'"{NULS}" "${{#x}}"; read -r x || echo stdin-empty; exit 5'
)


def wait_for_held_shells(uid: int, count: int = 2) -> None:
    """Until ``count`` shells of ``uid`` wait held (their placeholder command is all spaces),
    i.e. the server's spares have set up their sandboxes."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(args) > 2 and args[1] == b"-c" and args[2] and not args[2].strip():
                held += 1
        if held >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"fewer than {count} held shells after 60 s")


@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_a_call_runs_in_a_held_shell_exactly_as_in_one_spawned_for_it(
    mcp: Mcp, sandbox: str
) -> None:
    long = PROBE + " #" + "x" * COMMAND_ROOM  # too long for the room: spawned for the call

    async def scenario() -> list[dict[str, object]]:
        options = WS if sandbox == "workspace-write" else ["--sandbox", "off"]
        async with mcp.client(*options) as client:
            results = []
            for command in (PROBE, PROBE, long, PROBE):
                results.append(payload(await client.call_tool("shell", shell_args(mcp, command))))
            return results

    results = asyncio.run(scenario())
    work = str(mcp.work)
    for data, held in zip(results, (True, True, False, True), strict=True):
        assert data["exit_code"] == 5, data
        lines = str(data["output"]).splitlines()
        shell, pwd, real, hold, room, args, nuls, length = lines[:8]
        assert shell.endswith("/bash") and (pwd, real, hold, room, args, length) == (
            work, work, "unset", "unset", "3", "1"
        )  # fmt: skip
        assert (int(nuls) > 3) == held, data  # held: the room left over is NULs
        assert lines[8:] == ["stdin-empty"]


def test_a_login_call_and_a_denied_one_are_as_without_a_held_shell(mcp: Mcp) -> None:
    mcp.write_rules('prefix_rule(["bash", "-lc", "echo no"], "forbidden")\n')

    async def scenario() -> tuple[dict[str, object], ...]:
        async with mcp.client() as client:
            login = await client.call_tool(
                "shell",
                shell_args(
                    mcp,
                    'echo "$0 $-" | tr -d "\\n"; shopt -q login_shell && echo " login"',
                    login=True,
                ),
            )
            denied = await client.call_tool("shell", shell_args(mcp, "echo no", login=True))
            after = await client.call_tool("shell", shell_args(mcp, "echo yes"))
            return payload(login), payload(denied), payload(after)

    login, denied, after = asyncio.run(scenario())
    assert str(login["output"]).rstrip().endswith(" login"), login
    assert denied["exit_code"] == 126 and "denied" in str(denied["output"]), denied
    assert after["output"] == "yes\n" and after["exit_code"] == 0


def test_a_gated_program_cannot_ask_for_a_hold(mcp: Mcp) -> None:
    """EXECGATE_HOLD never reaches a program through a gated exec (and a hold on a socket its
    parent did not make is ignored: tests/launcher/test_launcher_held.py)."""
    script = "EXECGATE_HOLD=3 env | grep -c '^EXECGATE_HOLD' ; true"

    async def scenario() -> dict[str, object]:
        async with mcp.client(*WS) as client:
            return payload(await client.call_tool("shell", shell_args(mcp, script)))

    assert asyncio.run(scenario())["output"] == "0\n"


def test_a_git_folder_made_after_the_shell_was_held_is_read_only_in_the_call(mcp: Mcp) -> None:
    """The spares' shells were set up before the user made a repository in the workspace: the
    call must not get a sandbox in which its `.git` is writable (red team: hooks planted)."""
    plant = "echo x > .git/hooks/planted; echo rc=$?; echo y > .git/config.new; echo rc=$?"

    async def scenario() -> list[str]:
        async with mcp.client(*WS) as client:
            await client.call_tool("shell", shell_args(mcp, "true"))
            wait_for_held_shells(os.getuid())  # both spares' sandboxes are set up
            (mcp.work / ".git" / "hooks").mkdir(parents=True)  # `git init`, outside
            outputs = []
            for _ in range(3):  # both spares, and one opened after
                data = payload(await client.call_tool("shell", shell_args(mcp, plant)))
                outputs.append(str(data["output"]))
            return outputs

    for output in asyncio.run(scenario()):
        assert output.count("rc=1") == 2, output
    assert not (mcp.work / ".git" / "hooks" / "planted").exists()
    assert not (mcp.work / ".git" / "config.new").exists()


def test_held_shells_as_an_unprivileged_user(unprivileged: Any) -> None:
    """The same as an ordinary user's server, in workspace-write: calls are held, a `.git` made
    after the shells were held is read-only, and a gated program cannot ask for a hold."""
    work = unprivileged.make_dir()  # the server's workspace (its cwd) and the calls' workdir
    probe = f'echo "nuls={NULS}"'
    plant = "echo x > .git/hooks/planted; echo rc=$?"
    forged = "EXECGATE_HOLD=3 env | grep -c '^EXECGATE_HOLD'; true"

    def output(answer: dict[str, Any]) -> str:
        text: str = json.loads(answer["result"]["content"][0]["text"])["output"]
        return text

    with RawServer(unprivileged, work, *WS) as server:
        call = {"workdir": str(work), "login": False}
        first = output(server.shell(command=probe, **call))
        assert int(first.split("=")[1]) > 3, first  # held
        wait_for_held_shells(unprivileged.uid)  # both spares' sandboxes are set up
        (work / ".git" / "hooks").mkdir(parents=True)  # the user's `git init`, outside
        os.chown(work / ".git", unprivileged.uid, unprivileged.gid)
        os.chown(work / ".git" / "hooks", unprivileged.uid, unprivileged.gid)
        for _ in range(3):
            assert output(server.shell(command=plant, **call)).endswith("rc=1\n")
        assert output(server.shell(command=forged, **call)) == "0\n"
    assert not (work / ".git" / "hooks" / "planted").exists()
