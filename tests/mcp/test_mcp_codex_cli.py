"""The real Codex CLI 0.169 (from ``.ci/node``, installed by ``.ci/run``) as the MCP client of
``execgate mcp``, with the configuration docs/mcp.md documents and a fake model on loopback
(fakemodel.py) that calls ``shell``. One Codex home and one model for the module.

Shown: calls round-trip; a forbidden program is refused with its rule; the sandbox Codex asks
for per call (``permissionProfile``) is the one enforced -- read-only, workspace-write with
``--add-dir`` roots within the server's bounds, network as ``network_access`` says;
under ``codex exec`` an approval is not reported as a human's; in Codex's TUI (on a terminal
driven by tmux) the approval form is answered with one key."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakemodel import FakeModel
from mcpharness import Mcp, clean_up, make_world

REPO = Path(__file__).resolve().parents[2]
CODEX = (
    REPO
    / ".ci/node/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
)
DOCS = REPO / "docs/mcp.md"

pytestmark = pytest.mark.skipif(
    not os.access(CODEX, os.X_OK), reason="Codex 0.169 is not installed (.ci/run installs it)"
)


def documented_config() -> str:
    """The Codex configuration docs/mcp.md gives (its first ```toml block)."""
    found = re.search(r"```toml\n(.*?)```", DOCS.read_text(), re.S)
    assert found, "docs/mcp.md has no toml block"
    return found.group(1)


@dataclass
class CodexWorld:
    world: Mcp
    model: FakeModel
    env: dict[str, str]  # Codex's own
    extra: Path  # a --writable-root of the server, given to Codex with --add-dir
    other: Path  # given to Codex with --add-dir, not a root of the server

    def run(self, *flags: str, calls: list[str]) -> list[Any]:
        """``codex exec FLAGS PROMPT``: the model runs each command with ``shell`` in the
        workspace; what each call returned."""
        tag = uuid.uuid4().hex
        # non-login shells: a login shell's /etc/profile resets PATH (the tests' programs)
        work = str(self.world.work)
        script = {
            "tag": tag,
            "calls": [{"command": c, "workdir": work, "login": False} for c in calls],
        }
        done = subprocess.run(
            [str(CODEX), "exec", "--skip-git-repo-check", *flags, json.dumps(script)],
            cwd=self.world.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
        )
        outputs = self.model.outputs.get(tag, [])
        assert len(outputs) == len(calls), (done.stdout, done.stderr)
        assert not any("unsupported call" in str(o) for o in outputs), outputs
        return outputs


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodexWorld]:
    # Under /tmp, which Codex's workspace-write makes writable: the server's bounds
    # (exclude_tmp) cut that to the workspace and --writable-root.
    root = Path(tmp_path_factory.mktemp("codex"))
    world = make_world(root)
    extra, other = root / "extra", root / "other"
    extra.mkdir()
    other.mkdir()
    # The documented `args = ["mcp"]`: rules and sandbox settings come from EXECGATE_HOME.
    home = Path(world.env["EXECGATE_HOME"])
    (home / "rules").mkdir()
    shutil.copy(world.rules, home / "rules" / "default.rules")
    (home / "config.toml").write_text(
        f'[sandbox]\nexclude_tmp = true\nexclude_tmpdir = true\nwritable_roots = ["{extra}"]\n'
    )
    model = FakeModel()
    client_home = root / "codex-client"
    client_home.mkdir()
    server_env = {k: world.env[k] for k in world.env if k not in ("PATH", "HOME", "LANG")}
    config = re.sub(
        r"^env = .*$",
        "env = { " + ", ".join(f'{k} = "{v}"' for k, v in server_env.items()) + " }",
        documented_config(),
        flags=re.M,
    )
    assert config != documented_config()
    (client_home / "config.toml").write_text(
        'model = "fake-model"\nmodel_provider = "fake"\n'
        + config
        + f'\n[model_providers.fake]\nname = "fake"\nbase_url = "{model.base_url}"\n'
        'wire_api = "responses"\n'
    )
    env = {
        **world.env,
        "CODEX_HOME": str(client_home),
        # `command = "execgate"`: this checkout's, found on PATH as the docs say
        "PATH": f"{Path(sys.executable).parent}:{world.env['PATH']}",
    }
    yield CodexWorld(world, model, env, extra, other)
    model.close()
    clean_up(world)


def _probe(codex: CodexWorld, name: str) -> str:
    """Writes to the workspace, outside it, to both --add-dir folders, and a connection to the
    fake model's port, each reported as ``what=status``."""
    w = codex.world
    return (
        f"echo x > {w.work}/{name}; echo work=$?; "
        f"echo x > {w.outside}/{name}; echo outside=$?; "
        f"echo x > {codex.extra}/{name}; echo extra=$?; "
        f"echo x > {codex.other}/{name}; echo other=$?; "
        f"(exec 3<>/dev/tcp/127.0.0.1/{codex.model.port}) 2>/dev/null; echo net=$?"
    )


def _verdicts(result: Any) -> dict[str, str]:
    assert isinstance(result, dict), result
    return dict(re.findall(r"^(\w+)=(\d+)$", result["output"], re.M))


def test_documented_configuration_is_codex_0_169s() -> None:
    config = tomllib.loads(documented_config())
    assert config["features"]["shell_tool"] is False
    server = config["mcp_servers"]["execgate"]
    assert server["command"] == "execgate" and server["args"] == ["mcp"]
    assert server["default_tools_approval_mode"] == "approve" and server["required"] is True
    assert server["tool_timeout_sec"] >= 300 and "EXECGATE_HOME" in server["env"]


def test_workspace_write_with_add_dir_and_network(codex: CodexWorld) -> None:
    """One `codex exec -s workspace-write --add-dir ...` turn: a call round-trips, a forbidden
    program is refused with its rule, writes go where Codex's permission profile and the
    server's bounds both allow, and the network is on because network_access says so."""
    probe, forbidden, asked = codex.run(
        "-s", "workspace-write", "--add-dir", str(codex.extra), "--add-dir", str(codex.other),
        "-c", "sandbox_workspace_write.network_access=true",
        calls=[_probe(codex, "ws"), "marker now; echo after=$?", "askme please; echo after=$?"],
    )  # fmt: skip
    assert _verdicts(probe) == {"work": "0", "outside": "1", "extra": "0", "other": "1", "net": "0"}
    assert (codex.world.work / "ws").exists() and (codex.extra / "ws").exists()
    assert not (codex.world.outside / "ws").exists() and not (codex.other / "ws").exists()
    assert isinstance(forbidden, dict)
    rules = Path(codex.world.env["EXECGATE_HOME"]) / "rules" / "default.rules"
    assert (
        f"execgate: denied: marker now: marker must not run (rule {rules}:1)"
        in (forbidden["output"])
    )
    assert "after=126" in forbidden["output"]
    # codex exec answers the approval request itself, without showing it to anyone
    assert isinstance(asked, dict)
    assert "the client declined without showing the question (codex exec" in asked["output"]
    assert "declined by the user" not in asked["output"] and "after=126" in asked["output"]


def test_read_only(codex: CodexWorld) -> None:
    [read_only] = codex.run("-s", "read-only", calls=[_probe(codex, "ro")])
    assert _verdicts(read_only) == {
        "work": "1", "outside": "1", "extra": "1", "other": "1", "net": "1"
    }  # fmt: skip


# -- Codex's TUI on a terminal driven by tmux ---------------------------------------------------


def test_tui_approval_is_one_key(codex: CodexWorld) -> None:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    tag = uuid.uuid4().hex
    call = {"command": "askme tui", "workdir": str(codex.world.work), "login": False}
    script = {"tag": tag, "calls": [call]}
    socket = f"egcodex-{tag[:8]}"

    def tmux_cmd(*args: str) -> str:
        done = subprocess.run(
            [tmux, "-L", socket, *args], env=codex.env, capture_output=True, text=True, timeout=30
        )
        return done.stdout

    # --no-daemon: the TUI's background server would outlive the test (and take ~20 s to
    # install into a fresh CODEX_HOME); the form is the same.
    command = [str(CODEX), "--no-daemon", "-s", "workspace-write", json.dumps(script)]
    subprocess.run(
        [tmux, "-L", socket, "new-session", "-d", "-x", "160", "-y", "50", "-c",
         str(codex.world.work), *command],
        env=codex.env, check=True, timeout=30,
    )  # fmt: skip
    try:

        def screen() -> str:
            return tmux_cmd("capture-pane", "-p")

        codex.world.wait_for(lambda: "Allow once" in screen(), "the approval form", 90)
        form = screen()
        assert "/askme tui` requires approval" in form.replace("\n", " ") or "askme" in form
        assert "Reason" not in form  # nothing to type: the decision is the only field
        assert "Field 1/1" in form

        # The TUI drops keys that come right after it shows a form (so a key meant for
        # something else approves nothing): Enter again while the form is still up.
        def answered() -> object:
            outputs = codex.model.outputs.get(tag)
            if not outputs and "Allow once" in screen():
                tmux_cmd("send-keys", "Enter")
                time.sleep(0.5)  # (a pace for polling, not a synchronisation)
            return outputs

        outputs = codex.world.wait_for(answered, "the result", 60)
        [result] = outputs
        assert isinstance(result, dict) and result["output"] == "askme ran:tui\n"
    finally:
        tmux_cmd("kill-server")
