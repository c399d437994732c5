"""The model does not pick its writable root (issue #6 item 7), and what decides policy is never
writable from inside a session.

* `execgate mcp` fixes the workspace when it starts: a call's `workdir` of `/` or the home
  folder runs there, read-only.
* Rules folders (execgate's and Codex's, user and system), `config.toml`, the trust list,
  caches, logs and the control folder stay read-only even when a writable root contains them,
  for `execgate mcp` and `execgate run`; the next call is still judged by the same rules.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from mcpharness import payload

from .securityharness import MODES, WS, World


def _probe(targets: dict[str, Path]) -> str:
    """bash that writes into each target (creating folders on the way) and says how it went."""
    lines = ["pwd"]
    for name, path in targets.items():
        lines.append(f"( mkdir -p '{path.parent}' && printf x >> '{path}' ) 2>/dev/null; "
                     f"echo '{name}='$?")  # fmt: skip
    return "\n".join(lines)


def _verdicts(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def _state_targets(world: World) -> dict[str, Path]:
    env = world.env
    home, execgate_home = Path(env["HOME"]), Path(env["EXECGATE_HOME"])
    codex_home = Path(env["CODEX_HOME"])
    targets = {
        "user_rules": execgate_home / "rules" / "default.rules",
        "config": execgate_home / "config.toml",
        "trust": execgate_home / "trusted-projects.toml",
        "cache": execgate_home / "cache" / "x",
        # a start-up plan the next session's native front would follow (docs/protocol.md §8)
        "run_plan": execgate_home / "cache" / "run-plans" / "0000000000000000",
        "log": execgate_home / "log" / "escalations.log",
        "control": execgate_home / "control" / "mcp-1.json",
        "default_home_rules": home / ".execgate" / "rules" / "x.rules",
        "codex_rules": codex_home / "rules" / "x.rules",
        "default_codex_rules": home / ".codex" / "rules" / "x.rules",
    }
    if world.user is None:  # only root may move the admin folders (an ordinary user's are /etc's)
        targets |= {
            "system_rules": Path(env["EXECGATE_SYSTEM_DIR"]) / "rules" / "x.rules",
            "system_requirements": Path(env["EXECGATE_SYSTEM_DIR"]) / "requirements.toml",
            "codex_system_rules": Path(env["EXECGATE_CODEX_SYSTEM_DIR"]) / "rules" / "x.rules",
        }
    return targets


def _still_denied(world: World, output: str) -> None:
    assert "execgate: denied" in output and "marker ran" not in output, output


@pytest.mark.parametrize("where", ["root", "home"])
def test_mcp_workdir_gives_no_write_access(world: World, where: str) -> None:
    m = world.mcp
    workdir = "/" if where == "root" else m.env["HOME"]
    targets = {
        "work": m.work / "ok",
        "outside": m.outside / "x",
        "home": Path(m.env["HOME"]) / "x",
        "in_workdir": Path(workdir) / f"{m.tag}-x",
        **_state_targets(world),
    }

    async def scenario() -> None:
        async with world.client(*WS) as client:
            args = {"command": _probe(targets), "workdir": workdir, "login": False}
            data = payload(await client.call_tool("shell", args))
            assert data["output"].splitlines()[0] == workdir  # it runs there
            verdicts = _verdicts(data["output"])
            assert verdicts.pop("work") == "0"
            assert verdicts == {name: "1" for name in verdicts}, verdicts
            # chained: the next call is judged by the same rules
            args = {"command": "marker", "workdir": workdir, "login": False}
            _still_denied(world, payload(await client.call_tool("shell", args))["output"])

    asyncio.run(scenario())
    assert not (Path(workdir) / f"{m.tag}-x").exists()


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_mcp_state_stays_read_only_inside_a_writable_root(world: World, mode: str) -> None:
    """Everything (homes, system folders) lies inside a --writable-root here."""
    m = world.mcp
    targets = {"work": m.work / "ok", "elsewhere": m.outside / "x", **_state_targets(world)}

    async def scenario() -> None:
        async with world.client(*MODES[mode], "--writable-root", str(m.root)) as client:
            args = {"command": _probe(targets), "workdir": str(m.work), "login": False}
            verdicts = _verdicts(payload(await client.call_tool("shell", args))["output"])
            assert verdicts.pop("work") == "0"
            assert verdicts.pop("elsewhere") == "0"  # the root is writable otherwise
            assert verdicts == {name: "1" for name in verdicts}, verdicts
            args = {"command": "marker", "workdir": str(m.work), "login": False}
            _still_denied(world, payload(await client.call_tool("shell", args))["output"])

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_run_state_stays_read_only_inside_a_writable_root(world: World, mode: str) -> None:
    m = world.mcp
    targets = {"work": m.work / "ok", "elsewhere": m.outside / "x", **_state_targets(world)}
    options = [o for o in MODES[mode] if o not in ("--exclude-tmp", "--exclude-tmpdir")]
    command = [sys.executable, "-m", "execgate", "run", "--rules", str(m.rules), *options]
    result = world.run([*command, "--", "bash", "-c", _probe(targets)], cwd=m.root)
    assert result.returncode == 0, result.stderr
    verdicts = _verdicts(result.stdout)
    assert verdicts.pop("work") == "0"
    assert verdicts.pop("elsewhere") == "0"
    assert verdicts == {name: "1" for name in verdicts}, verdicts
    again = world.run([*command, "--", "marker"], cwd=m.root)
    assert again.returncode == 126 and "execgate: denied" in again.stderr
