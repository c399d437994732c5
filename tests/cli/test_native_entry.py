"""The installed ``execgate`` command is native (native/entry.c, docs/protocol.md §8): ``run``
goes straight into the native front in that process, everything else (and a run the front
declines) to the Python command line ``execgate-py`` beside it. Real installed programs (this
checkout's ``pip install -e``), as root and as the unprivileged user.

Which path ran is read from the decision log, as in test_native_front.py: the process the test
started is the first record's ``ppid`` on the fast path (the front forked the server that the
record names) and its ``pid`` on the slow path (the Python command line, exec'd in place)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cliharness import World, one_error

ENTRY = Path(sys.executable).parent / "execgate"
pytestmark = pytest.mark.skipif(
    not ENTRY.is_file() or ENTRY.read_bytes()[:4] != b"\x7fELF",
    reason="no native execgate command installed beside this Python (pip install -e .)",
)


def records(home: Path) -> list[dict[str, Any]]:
    path = home / "log" / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def gated(
    world: World, *command: str | bytes, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """``execgate run -- COMMAND``: its status, stderr and which path ran it."""
    before = len(records(world.execgate_home))
    process = subprocess.Popen(
        [ENTRY, "run", "--", *command],
        env=world.env(env),
        cwd=world.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _, err = process.communicate(timeout=60)
    first = records(world.execgate_home)[before]
    path = (
        "fast" if first["ppid"] == process.pid else "slow" if first["pid"] == process.pid else "?"
    )
    return process.returncode, err.decode(), path


def test_run_starts_natively_and_every_other_command_is_pythons(world: World) -> None:
    version = subprocess.run([ENTRY, "--version"], env=world.env(), capture_output=True, text=True)
    assert version.stdout.startswith("execgate "), version
    assert gated(world, "dash", "-c", "exit 3")[::2] == (3, "slow")  # writes the plan
    assert gated(world, "dash", "-c", "exit 4")[::2] == (4, "fast")
    assert gated(world, "dash", "-c", "exit 5", env={"EXECGATE_FAST_START": "0"})[::2] == (
        5,
        "slow",
    )
    # the front in this very process: the command's launcher's parent is `execgate` itself
    show = 'F=$(cut -d" " -f4 /proc/$PPID/stat); cat /proc/$F/comm'
    done = subprocess.run(
        [ENTRY, "run", "--", "dash", "-c", show], env=world.env(), cwd=world.work,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == "execgate\n", done
    verify = subprocess.run([ENTRY, "log", "verify"], env=world.env(), capture_output=True)
    assert verify.returncode == 0, verify


# Fields that differ between any two runs (the session, the time, the processes, the chain).
VARYING = ("time", "session", "pid", "ppid", "prev")


def test_the_fronts_first_record_is_the_slow_paths(world: World) -> None:
    """The record the front writes in C is the one the Python server writes for the same
    command: characters outside ASCII, above U+FFFF, control characters, undecodable bytes,
    a word longer than a record keeps."""
    command = [
        b"dash",
        b"-c",
        b"exit 0",
        '\u00e9\U0001f600\t"\\\x7f'.encode(),
        b"\xff\xc3(\xed\xa0\x80",
    ]
    command.append(b"y" * 5000)
    assert gated(world, *command)[2] == "slow"  # the plan
    firsts = []
    for env, path in ((None, "fast"), ({"EXECGATE_FAST_START": "0"}, "slow")):
        before = len(records(world.execgate_home))
        assert gated(world, *command, env=env)[::2] == (0, path)
        firsts.append(records(world.execgate_home)[before])
    fast, slow = ({k: v for k, v in r.items() if k not in VARYING} for r in firsts)
    assert fast == slow
    assert fast["argv_cut"] == 5000 - 4096 and fast["argv"][4] == "\udcff\udcc3(\udced\udca0\udc80"


def test_a_locale_python_would_not_decode_as_utf8_sends_non_ascii_to_python(
    world: World,
) -> None:
    latin = {"LC_ALL": "en_US.ISO-8859-1"}
    assert gated(world, "dash", "-c", "exit 0")[2] == "slow"  # the plan
    assert gated(world, "dash", "-c", "exit 0", env=latin)[2] == "fast"
    assert gated(world, "dash", "-c", "exit 0", "\u00e9", env=latin)[2] == "slow"
    assert gated(world, "dash", "-c", "exit 0", "\u00e9")[2] == "fast"


def test_a_run_the_front_declines_goes_to_python_once(world: World) -> None:
    """A first program a rule names must be judged by the server: the front hands the
    command line to ``execgate-py`` (which does not hand it back), and the rule applies."""
    rules = world.execgate_home / "rules"
    rules.mkdir()
    (rules / "t.rules").write_text('prefix_rule(pattern=["dash"], decision="forbidden")\n')
    for _ in range(2):  # the second time with a plan written
        status, err, path = gated(world, "dash", "-c", "true")
        assert (status, path) == (126, "slow"), err
        assert "execgate: denied: dash -c true" in err


def test_concurrent_fast_and_slow_runs_keep_one_chain(world: World) -> None:
    """Fronts (C) and servers (Python) of several sessions append to one log at once."""
    assert gated(world, "dash", "-c", "true")[2] == "slow"
    runs = [
        subprocess.Popen(
            [ENTRY, "run", "--", "dash", "-c", f"exit {n % 4}"],
            env=world.env({"EXECGATE_FAST_START": "0"} if n % 5 == 0 else None),
            cwd=world.work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(10)
    ]
    assert [r.wait(timeout=120) for r in runs] == [n % 4 for n in range(10)]
    verify = subprocess.run([ENTRY, "log", "verify"], env=world.env(), capture_output=True)
    assert verify.returncode == 0, verify
    assert len({r["session"] for r in records(world.execgate_home)}) == 11


def test_without_its_python_command_line_it_says_so(world: World, tmp_path: Path) -> None:
    alone = tmp_path / "bin" / "execgate"
    alone.parent.mkdir()
    shutil.copy2(ENTRY, alone)
    for argv in (["--version"], ["run", "--", "true"]):
        done = subprocess.run(
            [alone, *argv], env=world.env(), cwd=world.work, capture_output=True, text=True
        )
        assert "cannot run" in one_error(done, 70), done


def test_as_an_unprivileged_user(unprivileged: Any) -> None:
    work = unprivileged.make_dir()
    home = unprivileged.make_dir()
    env = {"HOME": str(home), "EXECGATE_HOME": str(home / ".execgate")}
    show = 'F=$(cut -d" " -f4 /proc/$PPID/stat); cat /proc/$F/comm; exit 6'
    fronts = []
    for _ in range(2):
        done = unprivileged.run([str(ENTRY), "run", "--", "dash", "-c", show], env=env, cwd=work)
        assert done.returncode == 6, done.stderr
        fronts.append(done.stdout.decode().strip())
    assert fronts[1] == "execgate"  # the plan is its own, the front followed it
    verify = unprivileged.run([str(ENTRY), "log", "verify"], env=env, cwd=work)
    assert verify.returncode == 0, verify.stderr
