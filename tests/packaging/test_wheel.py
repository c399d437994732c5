"""The package as users get it: ``python -m build`` makes an sdist and a ``py3-none-<platform>``
wheel from it, the wheel installs into a fresh venv, and that install gates for real.

Building in isolated environments and installing every dependency takes a minute or two, so the
full round trip runs when asked for with ``EXECGATE_TEST_WHEEL=1`` (`.ci/run` sets it) or under
a ``CI`` variable; the metadata checks always run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_metadata_names_the_licence_classifiers_and_urls() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "Operating System :: POSIX :: Linux" in project["classifiers"]
    assert {"Homepage", "Documentation", "Issues"} <= set(project["urls"])


def _source_copy(destination: Path) -> Path:
    """The checkout's files (tracked and new, not ignored: no venv, no build outputs)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file() and not source.is_relative_to(ROOT / "src/execgate/_bin"):
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    return destination


@pytest.mark.skipif(
    not (os.environ.get("CI") or os.environ.get("EXECGATE_TEST_WHEEL")),
    reason="the build round trip runs in CI (set EXECGATE_TEST_WHEEL=1 to run it here)",
)
def test_build_install_and_gate(tmp_path: Path) -> None:
    source = _source_copy(tmp_path / "src")
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    machine = platform.machine()
    wheels = list(dist.glob("execgate-*.whl"))
    assert [w.name.split("-", 2)[2] for w in wheels] == [f"py3-none-linux_{machine}.whl"]
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    assert {"execgate/_bin/libexecgate.so", "execgate/_bin/execgate-launch"} <= names
    # the `execgate` command is native (native/entry.c), a script of the wheel's own; the
    # Python command line is the console script `execgate-py`
    with zipfile.ZipFile(wheels[0]) as wheel:
        entry = wheel.read("execgate-0.1.0.data/scripts/execgate")
        points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "execgate-py = execgate.console:entry" in wheel.read(points).decode()
    assert entry[:4] == b"\x7fELF"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", str(wheels[0])],
        check=True,
        capture_output=True,
        timeout=600,
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    version = subprocess.run(
        [str(venv / "bin/execgate"), "--version"], env=env, capture_output=True, text=True
    )
    assert version.stdout.startswith("execgate "), version
    gated = subprocess.run(
        [str(venv / "bin/execgate"), "run", "--", "bash", "-c", "true && echo ran; git push"],
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # no terminal: a prompt is denied with a message
    )
    assert gated.stdout == "ran\n", gated
    assert "execgate: denied: git push: publishes or changes something" in gated.stderr
    assert gated.returncode == 126
    # the next run starts natively, from the plan the first one left
    show = 'F=$(cut -d" " -f4 /proc/$PPID/stat); cat /proc/$F/comm'
    fast = subprocess.run(
        [str(venv / "bin/execgate"), "run", "--", "dash", "-c", show],
        env=env, cwd=home, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    again = subprocess.run(
        [str(venv / "bin/execgate"), "run", "--", "dash", "-c", show],
        env=env, cwd=home, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (fast.returncode, again.stdout) == (0, "execgate\n"), (fast, again)

    # `execgate mcp` without the MCP SDK (a test dependency only): the wheel's own server
    # answers a client and runs a gated call.
    assert subprocess.run([str(venv / "bin/python"), "-c", "import mcp"]).returncode != 0
    messages = [
        {"method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                            "clientInfo": {"name": "wheel", "version": "1"}}},
        {"method": "tools/call", "params": {"name": "shell", "arguments": {
            "command": "echo mcp-$((6*7)); git push", "workdir": str(home), "login": False}}},
    ]  # fmt: skip
    server = subprocess.Popen(
        [str(venv / "bin/execgate"), "mcp", "--sandbox", "off", "--on-prompt", "deny"],
        env=env,
        cwd=home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert server.stdin is not None and server.stdout is not None
    replies = []
    for number, message in enumerate(messages, 1):
        server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": number, **message}).encode())
        server.stdin.write(b"\n")
        server.stdin.flush()
        replies.append(json.loads(server.stdout.readline()))
        assert replies[-1].get("id") == number, replies
    server.stdin.close()
    assert server.wait(timeout=120) == 0
    assert replies[0]["result"]["serverInfo"]["name"] == "execgate", replies
    output = replies[1]["result"]["structuredContent"]["output"]
    assert output.startswith("mcp-42\nexecgate: denied: git push"), replies
