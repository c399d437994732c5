"""Whatever the umask, what execgate creates for a user is the user's alone: files 0600,
folders 0700. Under ``umask 000`` every command that writes something runs for real, then
every file and folder under ``$EXECGATE_HOME`` is checked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from mcpharness import Mcp, clean_up, make_world, payload, shell_args

from execgate.gate.approvals import UserApprovals
from execgate.gate.escalation import ApprovalRequest
from execgate.policy import append_allow_rule, load_layered_policy

from .conftest import EXECGATE, FORBID_MARKER, Homes, Server


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def modes_under(top: Path) -> dict[str, int]:
    """Mode bits of everything below ``top`` (sockets excepted: their folder guards them)."""
    found: dict[str, int] = {}
    for folder, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            st = path.lstat()
            if not stat.S_ISSOCK(st.st_mode):
                found[str(path.relative_to(top))] = stat.S_IMODE(st.st_mode)
    return found


def assert_private(top: Path) -> None:
    modes = modes_under(top)
    assert modes, f"nothing was created under {top}"
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if Path(top, name).is_dir() else 0o600)
    }
    assert wrong == {}


def execgate_umask0(homes: Homes, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECGATE, *args],
        env=homes.env(),
        cwd=homes.work,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0),
    )


def test_cli_creates_private_files_under_umask_000(homes: Homes, server: Server) -> None:
    server.served.document = FORBID_MARKER.encode()
    homes.requirements(f'requirements_url = "{server.url}"\n')  # the requirements cache
    home = homes.execgate_home
    home.rmdir()  # let execgate create even its home
    for args in (
        ["rules", "init"],  # the user's rules file
        ["trust", str(homes.work)],  # the trust list
        ["run", "--audit", str(homes.root / "a.jsonl"), "--", "true"],  # logs, audit
    ):
        result = execgate_umask0(homes, *args)
        assert result.returncode == 0, (args, result.stderr)
    # A big rules file, so its evaluation is cached.
    (home / "rules" / "big.rules").write_text(
        "".join(f'prefix_rule(["prog{i}"], "prompt")\n' for i in range(400))
    )
    (home / "rules" / "big.rules").chmod(0o600)
    assert execgate_umask0(homes, "check", "--", "ls").returncode == 0
    names = set(modes_under(home))
    for expected in ("rules/default.rules", "trusted-projects.toml", "log/escalations.log",
                     "cache/policy", "cache/requirements"):  # fmt: skip
        assert expected in names, names
    assert_private(home)
    assert stat.S_IMODE((homes.root / "a.jsonl").stat().st_mode) == 0o600


def test_always_answers_write_a_private_rules_file(homes: Homes, tmp_path: Path) -> None:
    target = tmp_path / "new" / "rules" / "default.rules"
    with umask(0):
        append_allow_rule(target, ["git", "push"])
    assert_private(tmp_path / "new")
    # What an "always" answer records, too.
    second = tmp_path / "second" / "default.rules"
    approvals = UserApprovals(load_layered_policy(tmp_path))  # only the built-in default
    request = SimpleNamespace(prefix=("make",), network=None)  # all that recording reads
    with umask(0):
        approvals.record(cast(ApprovalRequest, request), second)
    assert "make" in second.read_text()
    assert_private(tmp_path / "second")


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[Mcp]:
    world = make_world(tmp_path)
    yield world
    clean_up(world)


def test_mcp_run_folder_is_private_under_umask_000(mcp: Mcp) -> None:
    home = Path(mcp.env["EXECGATE_HOME"])
    home.rmdir()

    async def scenario() -> None:
        async with mcp.client("--sandbox", "off") as client:
            data = payload(await client.call_tool("shell", shell_args(mcp, "echo hi")))
            assert data["output"] == "hi\n"
            assert_private(home)  # while it runs: run/mcp-PID.json, the log

    with umask(0):
        asyncio.run(scenario())
