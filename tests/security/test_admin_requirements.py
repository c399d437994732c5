"""Admin requirements bind every session, through the real ``execgate run``, ``execgate mcp``
and ``execgate check``, as root and as an ordinary user:

* fail-closed means nothing runs: not the session's own command, not a tool call's shell (so
  not its builtins or redirections either);
* ``-r/--rules`` replaces the layers, never the requirements;
* an ordinary user cannot point execgate at another system folder, nor trade a signed
  requirements cache for an edited one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcpharness import Mcp, clean_up, make_world, payload, shell_args

from .conftest import (
    FORBID_MARKER,
    Homes,
    Keys,
    Server,
    as_user_under_admin,
    make_marker,
    run_execgate,
)

REFUSED_URL = "http://127.0.0.1:9/requirements.toml"  # the discard port: connection refused
FAIL_CLOSED = f'requirements_url = "{REFUSED_URL}"\nrequirements_timeout = 2\n'
SANDBOXES = [
    ["--sandbox", "off"],
    ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"],
    ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir", "--strict-exec"],
]
SANDBOX_IDS = ["off", "workspace-write", "strict-exec"]


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[Mcp]:
    world = make_world(tmp_path)
    yield world
    clean_up(world)


# --- fail-closed: nothing runs --------------------------------------------------------------


@pytest.mark.parametrize("sandbox", SANDBOXES, ids=SANDBOX_IDS)
def test_fail_closed_run_does_not_start_the_command(homes: Homes, sandbox: list[str]) -> None:
    homes.requirements(FAIL_CLOSED)
    target = homes.work / "created"
    touched = run_execgate(["run", *sandbox, "--", "/usr/bin/touch", str(target)], homes)
    assert touched.returncode == 126
    assert not target.exists()
    lines = touched.stderr.splitlines()
    assert len(lines) == 1, touched.stderr  # one line, with the reason
    assert lines[0].startswith(f"execgate: denied: /usr/bin/touch {target}: admin requirements")
    assert REFUSED_URL in lines[0] and "every command is denied" in lines[0]
    # A shell is a command like any other: its redirection never happens either.
    script = f"echo x > {target}; curl -s http://127.0.0.1:9/ > {target}.2"
    shell = run_execgate(["run", *sandbox, "--", "bash", "-c", script], homes)
    assert shell.returncode == 126
    assert not target.exists() and not Path(f"{target}.2").exists()


def test_fail_closed_mcp_call_runs_nothing(mcp: Mcp) -> None:
    Path(mcp.env["EXECGATE_SYSTEM_DIR"], "requirements.toml").write_text(FAIL_CLOSED)
    written = mcp.work / "written"
    appended = mcp.work / "appended"
    # Builtins and redirections only: no exec for the gate to deny, so only refusing to start
    # the shell at all can stop them.
    script = f"echo data > {written}; printf x >> {appended}; read -r v < /dev/null; cd /"

    async def scenario() -> dict[str, Any]:
        async with mcp.client("--sandbox", "off") as client:
            return payload(await client.call_tool("shell", shell_args(mcp, script)))

    data = asyncio.run(scenario())
    assert data["exit_code"] == 126
    assert "admin requirements from" in data["output"]
    assert "every command is denied" in data["output"]
    assert not written.exists() and not appended.exists()
    log = mcp.log()
    assert f"admin requirements from {REFUSED_URL} could not be fetched" in log  # said at start


# --- --rules keeps the requirements -----------------------------------------------------------


def allow_everything(folder: Path) -> Path:
    rules = folder / "mine.rules"
    rules.write_text('prefix_rule(["marker"], "allow")\nprefix_rule(["touch"], "allow")\n')
    rules.chmod(0o644)
    return rules


@pytest.mark.parametrize("sandbox", SANDBOXES, ids=SANDBOX_IDS)
def test_rules_flag_keeps_admin_forbidden_in_run(homes: Homes, sandbox: list[str]) -> None:
    homes.requirements(FORBID_MARKER)
    rules = allow_everything(homes.root)
    direct = run_execgate(["run", *sandbox, "-r", str(rules), "--", "marker"], homes)
    assert direct.returncode == 126
    assert "admin: no marker" in direct.stderr
    nested = run_execgate(["run", *sandbox, "-r", str(rules), "--", "bash", "-c", "marker"], homes)
    assert "admin: no marker" in nested.stderr
    assert not (homes.work / "marker-ran").exists()


def test_rules_flag_keeps_admin_forbidden_in_check(homes: Homes) -> None:
    homes.requirements(FORBID_MARKER)
    rules = allow_everything(homes.root)
    checked = run_execgate(["check", "-r", str(rules), "--", "marker"], homes)
    assert checked.returncode == 0, checked.stderr
    result = json.loads(checked.stdout)
    assert result["decision"] == "forbidden"
    assert [m["prefixRuleMatch"]["decision"] for m in result["matchedRules"]] == [
        "allow",
        "forbidden",
    ]


def test_check_output_is_codex_s_without_requirements(homes: Homes) -> None:
    rules = allow_everything(homes.root)
    checked = run_execgate(["check", "-r", str(rules), "--", "marker", "x"], homes)
    assert json.loads(checked.stdout) == {
        "matchedRules": [{"prefixRuleMatch": {"matchedPrefix": ["marker"], "decision": "allow"}}],
        "decision": "allow",
    }
    assert checked.stderr == ""


def test_rules_flag_keeps_admin_forbidden_in_mcp(mcp: Mcp) -> None:
    Path(mcp.env["EXECGATE_SYSTEM_DIR"], "requirements.toml").write_text(
        FORBID_MARKER.replace('"marker"', '"touch"')
    )
    mcp.write_rules('prefix_rule(["touch"], "allow")\n')  # the harness passes --rules
    target = mcp.outside / "touched"

    async def scenario() -> dict[str, Any]:
        async with mcp.client("--sandbox", "off") as client:
            return payload(await client.call_tool("shell", shell_args(mcp, f"touch {target}")))

    data = asyncio.run(scenario())
    assert "admin: no marker" in data["output"]
    assert data["exit_code"] == 126
    assert not target.exists()


# --- an ordinary user -------------------------------------------------------------------------


@pytest.fixture
def admin_dir() -> Iterator[Path]:
    """A root-owned folder, readable by everyone, to mount on /etc/execgate."""
    folder = Path(tempfile.mkdtemp(prefix="egadmin-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def admin_says(admin_dir: Path, text: str) -> None:
    path = admin_dir / "requirements.toml"
    path.write_text(text)
    path.chmod(0o644)


def user_world(unprivileged: Any) -> tuple[Path, dict[str, str]]:
    """A work folder with ``marker`` in it, and the user's environment, in which the user
    points EXECGATE_SYSTEM_DIR at a folder of its own without requirements."""
    work = unprivileged.make_dir()
    bin_dir = work / "bin"
    bin_dir.mkdir()
    make_marker(bin_dir)
    own_system = work / "my-system"
    own_system.mkdir()
    unprivileged.chown_tree(work)
    env = {
        "PATH": f"{bin_dir}:{unprivileged.env()['PATH']}",
        "EXECGATE_SYSTEM_DIR": str(own_system),
        "EXECGATE_CODEX_SYSTEM_DIR": str(own_system),
        "no_proxy": "*",
    }
    return work, env


def execgate_argv(*args: str) -> list[str]:
    return ["python3", "-m", "execgate", *args]


@pytest.mark.parametrize("sandbox", SANDBOXES[:2], ids=SANDBOX_IDS[:2])
def test_user_cannot_drop_requirements(
    unprivileged: Any, system_mountpoint: Path, admin_dir: Path, sandbox: list[str]
) -> None:
    admin_says(admin_dir, FORBID_MARKER)
    work, env = user_world(unprivileged)
    rules = allow_everything(work)
    unprivileged.chown_tree(work)

    def as_user(*args: str) -> Any:
        return as_user_under_admin(unprivileged, admin_dir, execgate_argv(*args), env=env, cwd=work)

    for argv in (["run", *sandbox, "--", "marker"], ["run", *sandbox, "-r", str(rules), "--",
                                                       "bash", "-c", "marker"]):  # fmt: skip
        result = as_user(*argv)
        assert result.returncode != 0, result
        assert b"admin: no marker" in result.stderr, result.stderr
    checked = as_user("check", "-r", str(rules), "--", "marker")
    assert json.loads(checked.stdout)["decision"] == "forbidden", checked.stderr
    assert not (work / "marker-ran").exists()


@pytest.mark.parametrize("sandbox", SANDBOXES[:2], ids=SANDBOX_IDS[:2])
def test_user_session_fails_closed(
    unprivileged: Any, system_mountpoint: Path, admin_dir: Path, sandbox: list[str]
) -> None:
    admin_says(admin_dir, FAIL_CLOSED)
    work, env = user_world(unprivileged)
    target = work / "created"
    result = as_user_under_admin(
        unprivileged,
        admin_dir,
        execgate_argv("run", *sandbox, "--", "/usr/bin/touch", str(target)),
        env=env,
        cwd=work,
    )
    assert result.returncode == 126, result
    assert b"every command is denied" in result.stderr
    assert not target.exists()


def test_user_cannot_swap_a_signed_cache(
    unprivileged: Any, system_mountpoint: Path, admin_dir: Path, server: Server, keys: Keys
) -> None:
    server.served.signature = keys.sign(server.served.document)
    server.served.cache_control = "no-cache"
    admin_says(
        admin_dir,
        f'requirements_url = "{server.url}"\nrequirements_timeout = 2\n'
        f'requirements_public_key = "{keys.public_base64}"\n',
    )
    work, env = user_world(unprivileged)

    def as_user(*args: str) -> Any:
        return as_user_under_admin(unprivileged, admin_dir, execgate_argv(*args), env=env, cwd=work)

    first = as_user("run", "--", "marker")
    assert b"admin: no marker" in first.stderr, first.stderr
    cache = unprivileged.home / ".execgate" / "cache" / "requirements"
    (document,) = cache.glob("*.toml")
    assert document.stat().st_uid == unprivileged.uid
    # The user empties its copy of the admin's rules (it owns the file), then takes the URL
    # away: the copy no longer verifies, so nothing runs at all.
    edited = as_user_under_admin(
        unprivileged, admin_dir, ["sh", "-c", f": > {document}"], env=env, cwd=work
    )
    assert edited.returncode == 0 and document.read_bytes() == b""
    server.stop()
    second = as_user("run", "--", "marker")
    assert second.returncode == 126
    assert b"was refused (its signature does not verify)" in second.stderr, second.stderr
    assert not (work / "marker-ran").exists()


# --- root may still move the folders (how every other test isolates itself) ------------------


def test_root_may_move_the_system_folder(homes: Homes) -> None:
    if os.geteuid() != 0:
        pytest.skip("as an ordinary user the variable is ignored (tested above)")
    homes.requirements(FORBID_MARKER)
    checked = run_execgate(["check", "--", "marker"], homes)
    assert json.loads(checked.stdout)["decision"] == "forbidden"
