"""Everyday mistakes end in one sentence (``execgate: error: …``) and an exit status, never a
traceback or an ``internal error``: each case is the real command line, run as a program."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cliharness import EXECGATE, World, one_error

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


def test_audit_pointing_at_a_folder_run(world: World) -> None:
    done = world.run("run", "--audit", str(world.work), "--", "true")
    assert "--audit" in one_error(done) and "Is a directory" in done.stderr


def test_audit_pointing_at_a_folder_mcp(world: World) -> None:
    done = world.run(
        "mcp", "--audit", str(world.work), input=json.dumps(INITIALIZE).encode() + b"\n"
    )
    assert "--audit" in one_error(done) and "Is a directory" in done.stderr


def test_config_that_is_not_utf8(world: World) -> None:
    (world.execgate_home / "config.toml").write_bytes(b"approval_timeout = 5 # caf\xe9\n")
    for argv in (["check", "--", "ls"], ["rules", "list"], ["run", "--", "true"]):
        line = one_error(world.run(*argv))
        assert "config.toml: not UTF-8 text (byte 26)" in line, argv


def test_trust_list_that_is_not_utf8(world: World) -> None:
    (world.execgate_home / "trusted-projects.toml").write_bytes(b'trusted = ["/caf\xe9"]\n')
    for argv in (["check", "--", "ls"], ["trust", str(world.work)], ["rules", "list"]):
        line = one_error(world.run(*argv))
        assert "trusted-projects.toml: not UTF-8 text (byte 16)" in line, argv


@pytest.mark.parametrize(
    "argv", [["check", "--", "ls"], ["run", "--", "true"], ["sandbox", "check"]]
)
def test_deleted_working_directory(world: World, argv: list[str]) -> None:
    gone = world.work / "gone"
    gone.mkdir()
    # A shell that stands in a folder someone else deletes, then runs execgate there.
    done = subprocess.run(
        [
            "sh",
            "-c",
            'cd "$1" && rmdir "$1" && shift && exec "$@"',
            "sh",
            str(gone),
            *EXECGATE,
            *argv,
        ],
        env=world.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "working directory no longer exists" in one_error(done)


# --- an unwritable HOME, as an ordinary user ------------------------------------------------


def _readonly_home(unprivileged) -> Path:  # type: ignore[no-untyped-def]
    home = unprivileged.make_dir(prefix="egtest-rohome-")
    home.chmod(0o555)
    return home


def test_unwritable_home_rules_init_and_trust(unprivileged) -> None:  # type: ignore[no-untyped-def]
    home = _readonly_home(unprivileged)
    env = {"HOME": str(home), "EXECGATE_HOME": str(home / ".execgate")}
    done = unprivileged.run([*EXECGATE, "rules", "init"], env=env, cwd=home)
    assert f"cannot write {home}/.execgate/rules/default.rules: Permission denied" in one_error(
        _text(done)
    )
    done = unprivileged.run([*EXECGATE, "trust", str(home)], env=env, cwd=home)
    assert "cannot write the trust list: Permission denied" in one_error(_text(done))
    assert not (home / ".execgate").exists()


def _text(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def test_unwritable_home_mcp_still_serves(unprivileged) -> None:  # type: ignore[no-untyped-def]
    """``execgate mcp`` works with a HOME it cannot write: its sockets and logs go to private
    folders under $XDG_RUNTIME_DIR (else /tmp), and it says where; a gated call runs."""
    home = _readonly_home(unprivileged)
    work = unprivileged.make_dir()
    runtime = unprivileged.make_dir(prefix="egtest-runtime-")
    runtime.chmod(0o700)
    messages = [
        INITIALIZE,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "shell",
                "arguments": {"command": "echo gated-$((6*7))", "workdir": str(work)},
            },
        },
    ]
    for xdg, where in ((str(runtime), str(runtime)), ("", "/tmp")):
        env = {
            "HOME": str(home),
            "EXECGATE_HOME": str(home / ".execgate"),
            "XDG_RUNTIME_DIR": xdg,
        }
        process = subprocess.Popen(
            unprivileged.argv([*EXECGATE, "mcp", "--sandbox", "off", "--elicitation", "never"]),
            env=unprivileged.env(env),
            cwd=work,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        replies = {}
        for message in messages:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
            if "id" in message:
                replies[message["id"]] = json.loads(process.stdout.readline())
        process.stdin.close()
        err = process.stderr.read().decode() if process.stderr else ""
        assert process.wait(timeout=60) == 0, err
        assert "gated-42" in json.dumps(replies[2]), (replies, err)
        assert "Traceback" not in err and "internal error" not in err
        said = re.search(r"the approvals control socket is (\S+/mcp-\d+\.sock)", err)
        assert said is not None, err
        socket = Path(said[1])
        assert socket.parent.parent == Path(where) and not socket.exists()  # gone at exit
        # The logs (decision log, escalations) move the same way, and it says where.
        moved = re.search(r"cannot be written; the logs are in (\S+)", err)
        assert moved is not None, err
        logs = Path(moved[1])
        assert logs.parent == Path(where) and logs.name.startswith("execgate-log-"), err
        assert (logs / "decisions.jsonl").stat().st_size > 0
        shutil.rmtree(logs)
    assert not (home / ".execgate").exists()
