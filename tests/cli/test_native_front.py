"""The native front of ``execgate run`` (native/front.c, docs/protocol.md §8): the real
``execgate run`` from a start-up plan, against the slow path (``EXECGATE_FAST_START=0``).

Which path ran is read from the decision log: the process the test started keeps its pid
through every exec (console script → front → Python slow path), so the first record's ``pid``
is that process on the slow path, and its ``ppid`` on the fast one (the record is written by
the server the front forked)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cliharness import EXECGATE, World

import execgate
from execgate.cli.run import LauncherGone, _launcher_options, outlive_signals
from execgate.gate import runplan

SLOW = {"EXECGATE_FAST_START": "0"}
# Fields that differ between any two runs (the session, the time, the processes, the chain).
VARYING = ("time", "session", "pid", "ppid", "prev")


def log_records(world: World) -> list[dict[str, Any]]:
    path = world.execgate_home / "log" / "decisions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def start(
    world: World,
    *command: str,
    env: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
    cwd: Path | None = None,
    execgate: tuple[str, ...] = (*EXECGATE, "run"),
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*execgate, *options, "--", *command],
        env=world.env(env),
        cwd=cwd or world.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def run(
    world: World,
    *command: str,
    env: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
    cwd: Path | None = None,
    execgate: tuple[str, ...] = (*EXECGATE, "run"),
) -> tuple[int, str, str]:
    """The command's status, stderr, and which path ran it (``fast``/``slow``)."""
    before = len(log_records(world))
    process = start(world, *command, env=env, options=options, cwd=cwd, execgate=execgate)
    _, err = process.communicate(timeout=60)
    first = log_records(world)[before]
    path = (
        "fast" if first["ppid"] == process.pid else "slow" if first["pid"] == process.pid else "?"
    )
    return process.returncode, err.decode(), path


def plan_files(world: World) -> list[Path]:
    folder = world.execgate_home / "cache" / "run-plans"
    return sorted(folder.iterdir()) if folder.exists() else []


def folder_of(socket_line: str) -> Path:
    """The session folder, from the ``EXECGATE_SOCKET`` the command wrote down."""
    return Path(socket_line.strip()).parent


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def gone_within(pids: list[int], seconds: float = 15.0) -> bool:
    """Whether all of ``pids`` end within ``seconds`` (a bound for a loaded machine, not a
    timing the test depends on: they are expected to end at once)."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_for(path: Path, seconds: float = 30.0) -> str:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.02)
    return path.read_text()


@pytest.fixture
def warm(world: World) -> World:
    """A world whose plan was written by one slow run."""
    status, err, path = run(world, "dash", "-c", "true")
    assert (status, path) == (0, "slow"), err
    (plan,) = plan_files(world)
    st = plan.lstat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, os.getuid())
    return world


def test_fast_path_logs_what_the_slow_path_logs_and_exits_alike(warm: World) -> None:
    cases = [
        ("dash", "-c", "exit 0"),
        ("dash", "-c", "exit 7"),
        ("dash", "-c", "kill -TERM $$"),
        ("dash", "-c", "kill -KILL $$"),
        ("dash", "-c", "ls / >/dev/null && cat /dev/null"),  # execs through the interposer
    ]
    for command in cases:
        fast_status, fast_err, fast = run(warm, *command)
        fast_records = log_records(warm)
        slow_status, slow_err, slow = run(warm, *command, env=SLOW)
        slow_records = log_records(warm)[len(fast_records) :]
        assert (fast, slow) == ("fast", "slow"), (command, fast_err, slow_err)
        assert fast_status == slow_status, (command, fast_err, slow_err)
        assert fast_err == slow_err
        session = fast_records[-1]["session"]
        fast_records = [r for r in fast_records if r["session"] == session]
        strip = [{k: v for k, v in r.items() if k not in VARYING} for r in fast_records]
        assert strip == [{k: v for k, v in r.items() if k not in VARYING} for r in slow_records]
    assert run(warm, "dash", "-c", "kill -TERM $$")[0] == -signal.SIGTERM


def test_a_first_program_a_rule_names_goes_to_the_slow_path(warm: World) -> None:
    rules = warm.execgate_home / "rules"
    rules.mkdir()
    (rules / "t.rules").write_text(
        'prefix_rule(pattern=["dash", "-c", "exit 9"], decision="forbidden")\n'
    )
    status, err, path = run(warm, "dash", "-c", "exit 9")  # the folder changed: stale
    assert (status, path) == (126, "slow"), err
    assert "execgate: denied: dash -c 'exit 9'" in err
    status, err, path = run(warm, "dash", "-c", "exit 9")  # a fresh plan: the snapshot asks
    assert (status, path) == (126, "slow"), err
    status, err, path = run(warm, "cat", "/dev/null")  # no rule names cat: fast again
    assert (status, path) == (0, "fast"), err


def test_an_edited_rules_file_makes_the_plan_stale(warm: World) -> None:
    rules = warm.execgate_home / "rules"
    rules.mkdir()
    rules_file = rules / "t.rules"
    rules_file.write_text('prefix_rule(pattern=["frobnicate"], decision="forbidden")\n')
    assert run(warm, "dash", "-c", "exit 3")[2] == "slow"
    assert run(warm, "dash", "-c", "exit 3")[2] == "fast"
    # same size, same folder: only the file's identity (mtime, ctime) tells
    rules_file.write_text('prefix_rule(pattern=["dash", "-c", "exit 3"], decision="forbidden")\n')
    status, err, path = run(warm, "dash", "-c", "exit 3")
    assert (status, path) == (126, "slow"), err


def test_a_plan_that_is_not_the_users_own_0600_file_is_not_followed(warm: World) -> None:
    (plan,) = plan_files(warm)
    plan.chmod(0o644)
    assert run(warm, "dash", "-c", "true")[2] == "slow"  # and the slow path replaced it
    assert run(warm, "dash", "-c", "true")[2] == "fast"
    (plan,) = plan_files(warm)
    moved = plan.with_name("elsewhere")
    plan.rename(moved)
    plan.symlink_to(moved)
    assert run(warm, "dash", "-c", "true")[2] == "slow"
    assert not plan.is_symlink()  # replaced by the slow path
    moved.unlink()
    # a line the front does not know: not its plan to follow
    text = plan.read_text()
    plan.write_text(text.replace("\nend\n", "\nsomething new\nend\n"))
    plan.chmod(0o600)
    assert run(warm, "dash", "-c", "true")[2] == "slow"


def test_sigterm_ends_the_session_and_nothing_outlives_it(warm: World) -> None:
    pidfile = warm.work / "pid"
    process = start(warm, "dash", "-c", f'sleep 60 & echo "$! $EXECGATE_SOCKET" > {pidfile}; wait')
    sleeper, socket_path = wait_for(pidfile).split()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    assert gone_within([int(sleeper)])
    assert not folder_of(socket_path).exists()
    records = log_records(warm)
    assert records[-1]["ppid"] == process.pid  # it was the fast path


def test_signals_at_the_server_as_its_session_ends_lose_no_record(warm: World) -> None:
    """SIGTERMs at the server, one each 0.1 ms from the moment its command ran `git`: the
    first ends the session; none of the others may end the server before it wrote git's
    record (a signal handler removed is the default action, death, until it is replaced).
    The window is microseconds: the unit test below checks it closed; this, the whole."""
    for attempt in range(3):
        pidfile = warm.work / f"server{attempt}"
        script = (
            "git --version >/dev/null && S=${EXECGATE_SNAPSHOT#/proc/}; "
            f'echo "${{S%%/*}}" > {pidfile}; exec sleep 60'
        )
        process = start(warm, "dash", "-c", script)
        server = int(wait_for(pidfile))
        deadline = time.monotonic() + 60  # (a bound for a loaded machine)
        while process.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                pytest.fail("the session never ended")
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGTERM)
            time.sleep(0.0001)
        assert process.wait() == -signal.SIGTERM
        records = log_records(warm)
        (session,) = {r["session"] for r in records if process.pid in (r["pid"], r["ppid"])}
        programs = [r["program"] for r in records if r["session"] == session]
        assert programs == ["/usr/bin/dash", "/usr/bin/git"], attempt


def test_the_servers_last_steps_never_leave_a_signal_its_default_action(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unit under the test above: the handlers are swapped for ones that do nothing,
    never through SIG_DFL (one SIGTERM from the front there, on a loaded machine, ended the
    server before it wrote its last records), and a SIGTERM then is outlived."""
    ending = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    before = {signum: signal.getsignal(signum) for signum in ending}
    loop = asyncio.new_event_loop()
    try:
        for signum in ending:
            loop.add_signal_handler(signum, lambda: None)
        set_to: list[object] = []
        real = signal.signal
        monkeypatch.setattr(signal, "signal", lambda s, h: (set_to.append(h), real(s, h))[1])
        outlive_signals(loop)
        assert signal.SIG_DFL not in set_to and signal.default_int_handler not in set_to
        os.kill(os.getpid(), signal.SIGTERM)
        loop.run_until_complete(asyncio.sleep(0.01))  # (we are still here)
    finally:
        monkeypatch.undo()
        loop.close()
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_ctrl_c_is_the_commands(warm: World) -> None:
    ready = warm.work / "ready"
    script = f'trap "exit 5" INT; echo > {ready}; while :; do sleep 0.05; done'
    process = start(warm, "dash", "-c", script)
    wait_for(ready)
    os.killpg(process.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
    assert process.wait(timeout=30) == 5
    assert log_records(warm)[-1]["ppid"] == process.pid


def test_the_server_killed_denies_every_exec_and_ends_the_session(warm: World) -> None:
    """The attack: the command kills the server (sandbox off, same user), then execs."""
    marker, info = warm.work / "marker", warm.work / "info"
    script = (
        f'echo "$EXECGATE_SOCKET" > {info}; '
        'S=${EXECGATE_SNAPSHOT#/proc/}; S=${S%%/*}; kill -KILL "$S"; '
        f"sleep 1; touch {marker}; echo survived"
    )
    process = start(warm, "dash", "-c", script)
    out, err = process.communicate(timeout=60)
    assert b"survived" not in out, err
    assert not marker.exists()
    assert process.returncode != 0
    assert not folder_of(info.read_text()).exists()
    # and the next session works
    assert run(warm, "dash", "-c", "exit 4")[:1] == (4,)


def test_the_front_killed_leaves_nothing_behind(warm: World) -> None:
    info = warm.work / "info"
    script = f'sleep 60 & echo "$! $PPID $EXECGATE_SNAPSHOT" > {info}; wait'
    process = start(warm, "dash", "-c", script)
    sleeper, launcher, snapshot = wait_for(info).split()
    server = int(snapshot.split("/")[2])
    process.kill()
    process.wait(timeout=30)
    assert gone_within([int(sleeper), int(launcher), server])


def test_the_launcher_killed_leaves_nothing_behind(warm: World) -> None:
    """The command kills the launcher (its parent; same user, sandbox off): what it started
    is the front's to kill."""
    info = warm.work / "info"
    script = (
        f'setsid sleep 60 & echo "$! $EXECGATE_SOCKET" > {info}; sleep 0.2; '
        "kill -KILL $PPID; sleep 60"
    )
    process = start(warm, "dash", "-c", script)
    sleeper, socket_path = wait_for(info).split()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert b"execgate: error: the session launcher exited" in err
    assert gone_within([int(sleeper)])
    assert not folder_of(socket_path).exists()
    # the plan was not stale (whether the server read the launcher's command line before it
    # was killed or after): it is kept
    assert plan_files(warm)


def test_the_launcher_is_the_fronts_other_child_or_gone() -> None:
    """The server finds the launcher as its parent's other child; a command that ended (its
    launcher reaped) before the server looked leaves none: gone, not an error."""
    probe = (
        f"import sys; sys.path[:0] = {sys.path!r}; from execgate.cli.run import _launcher_pid; "
        "print(_launcher_pid())"
    )
    alone = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "$0"; true', probe],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert alone.stdout.split() == ["None"], alone.stderr
    beside = subprocess.run(
        ["sh", "-c", f'sleep 30 & "{sys.executable}" -c "$0"; echo $!; kill $!', probe],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found, sleeper = beside.stdout.split()
    assert found == sleeper, beside.stderr
    assert isinstance(_launcher_options(None, "/bin/true"), LauncherGone)


async def _adopt_a_gone_launcher() -> tuple[object, str]:
    from execgate.gate.launcher import Launcher, LauncherError

    ours, theirs = socket.socketpair()
    theirs.close()  # the launcher exited: its end of the channel is closed
    launcher, main = Launcher.adopt(None, ours, None, main_id=1)
    try:
        await asyncio.wait_for(main, timeout=30)
    except LauncherError as exc:
        said = str(exc)
    else:
        said = ""
    await asyncio.wait_for(launcher.shutdown(), timeout=30)
    return launcher.running, said


def test_a_gone_launcher_is_adopted_as_ended() -> None:
    """Adopting a launcher that has exited: the session sees its end on the channel, the
    command it was to start fails as a launcher that exited, and closing it ends at once."""
    running, said = asyncio.run(_adopt_a_gone_launcher())
    assert running is False
    assert "the session launcher exited" in said


def test_a_launcher_that_exited_is_gone_not_another_launcher() -> None:
    """What the server reads of the front's launcher: one that has exited (a zombie, its
    pid not yet reused) or was reaped is gone, which ends the session without calling its
    plan stale (a live one's options are read in every fast start above)."""
    true = shutil.which("true")
    assert true is not None
    dead = subprocess.Popen([true])
    while alive(dead.pid):
        time.sleep(0.01)  # (until it is a zombie: the test does not reap it yet)
    assert isinstance(_launcher_options(dead.pid, true), LauncherGone)
    dead.wait()
    assert isinstance(_launcher_options(dead.pid, true), LauncherGone)


@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_the_plan_lists_every_file_the_opening_touched(
    world: World, tmp_path: Path, sandbox: str
) -> None:
    """The slow path's opening under strace: every path it looked at below HOME,
    EXECGATE_HOME, CODEX_HOME and the working directory is an input of the plan (or one of
    the exceptions: what the session writes, the plan itself, the logs, the policy cache)."""
    trace = tmp_path / "trace"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(trace),
         *EXECGATE, "run", "--sandbox", sandbox, "--", "dash", "-c", "true"],
        env=world.env(SLOW),
        cwd=world.work,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (plan,) = plan_files(world)
    listed = set()
    for line in plan.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind in ("file", "absent", "dir"):
            listed.add(runplan.unescape(rest.split(" ")[0]))
    roots = [str(world.home), str(world.execgate_home), str(world.codex_home), str(world.work)]
    exceptions = [
        str(world.execgate_home / "cache"),  # the compiled-policy cache, the plan itself
        str(world.execgate_home / "log"),  # the logs it writes
        str(world.execgate_home / "run"),  # session folders
    ]
    touched = set()
    for line in trace.read_text().splitlines():
        if '"' not in line:
            continue
        path = line.split('"')[1]
        if not path.startswith("/") or "__pycache__" in path:
            continue
        if any(path == r or path.startswith(r + "/") for r in roots) and not any(
            path == e or path.startswith(e + "/") for e in exceptions
        ):
            touched.add(os.path.normpath(path))
    assert touched, "strace saw nothing"
    # a folder made on the way to a listed one (`mkdir -p`): the listed one's identity holds it
    implied = {os.path.dirname(p) for p in listed}
    while implied != (more := implied | {os.path.dirname(p) for p in implied}):
        implied = more
    assert sorted(touched - listed - implied - set(roots)) == [], sorted(touched - listed)


def test_the_server_ends_a_session_whose_plan_it_does_not_compute(warm: World) -> None:
    """A plan whose inputs hold but whose snapshot is not what they give (written by the
    user's own process: with the sandbox off, cooperative): the front follows it, the server
    finds the difference, ends the session at once, deletes the plan and says so."""
    (plan,) = plan_files(warm)
    unnamed = plan.read_text()  # no rule names dash
    rules = warm.execgate_home / "rules"
    rules.mkdir()
    (rules / "t.rules").write_text('prefix_rule(pattern=["dash"], decision="forbidden")\n')
    assert run(warm, "cat", "/dev/null")[2] == "slow"  # a fresh plan, its snapshot names dash
    named = plan.read_text()
    snapshot = next(line for line in unnamed.splitlines() if line.startswith("snapshot "))
    forged = "\n".join(
        snapshot if line.startswith("snapshot ") else line for line in named.splitlines()
    )
    plan.write_text(forged + "\n")
    marker = warm.work / "marker"
    process = start(warm, "dash", "-c", f"sleep 20; touch {marker}")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    assert b"execgate: error: the session was ended: its start-up plan was stale" in err
    assert not marker.exists()
    assert plan_files(warm) == []


def test_as_an_unprivileged_user(unprivileged: Any) -> None:
    """The fast path as an ordinary user: its plan is its own, and killing the server from
    the command still denies the exec after it."""
    work = unprivileged.make_dir()
    home = unprivileged.make_dir()
    env = {"HOME": str(home), "EXECGATE_HOME": str(home / ".execgate")}
    command = [*EXECGATE, "run", "--", "dash", "-c"]
    first = unprivileged.run([*command, "exit 5"], env=env, cwd=work)
    assert first.returncode == 5, first.stderr
    (plan,) = (home / ".execgate" / "cache" / "run-plans").iterdir()
    assert (plan.stat().st_uid, plan.stat().st_mode & 0o777) == (unprivileged.uid, 0o600)
    # the launcher's parent: the front (fast) or the server itself (slow)
    show = 'read -r stat < /proc/$PPID/stat; set -- $stat; echo "$4 $EXECGATE_SNAPSHOT"'
    second = unprivileged.run([*command, show], env=env, cwd=work)
    assert second.returncode == 0, second.stderr
    front, snapshot = second.stdout.decode().split()
    assert snapshot.startswith("/proc/") and snapshot != f"/proc/{front}/fd/100"  # fast
    marker = work / "marker"
    attack = (
        'S=${EXECGATE_SNAPSHOT#/proc/}; S=${S%%/*}; kill -KILL "$S"; '
        f"sleep 1; touch {marker}; echo survived"
    )
    third = unprivileged.run([*command, attack], env=env, cwd=work)
    assert b"survived" not in third.stdout, third.stderr
    assert third.returncode != 0
    assert not marker.exists()


def test_the_first_process_carries_the_gate(warm: World) -> None:
    """The command the front started is gated like any: a program a rule forbids, exec'd by
    it, is denied by the interposer and the server (which may still be starting: the request
    waits in the socket's backlog), in the same session."""
    rules = warm.execgate_home / "rules"
    rules.mkdir()
    (rules / "t.rules").write_text(
        'prefix_rule(pattern=["cat", "/etc/hostname"], decision="forbidden")\n'
    )
    assert run(warm, "dash", "-c", "true")[2] == "slow"  # the rules changed: a fresh plan
    status, err, path = run(warm, "dash", "-c", "cat /etc/hostname; echo cat=$?")
    assert (status, path) == (0, "fast"), err
    assert "execgate: denied: cat /etc/hostname" in err
    first, second = log_records(warm)[-2:]
    assert first["session"] == second["session"]
    assert (second["program"], second["decision"]) == ("/usr/bin/cat", "deny")


# -- sandboxed runs --------------------------------------------------------------------------

WW = ("--sandbox", "workspace-write")
# the launcher's parent: the front (fast) or the Python server itself (slow)
FRONT_PARENT = 'F=$(cut -d" " -f4 /proc/$PPID/stat); echo "parent $(cat /proc/$F/comm)"; '


@pytest.fixture
def warm_ww(world: World) -> World:
    """A world whose workspace-write plan was written by one slow run."""
    status, err, path = run(world, "dash", "-c", "true", options=WW)
    assert (status, path) == (0, "slow"), err
    (plan,) = plan_files(world)
    assert "launch-carveouts" in plan.read_text()
    return world


def test_a_sandboxed_run_starts_fast_confined_as_the_slow_path(warm_ww: World) -> None:
    """workspace-write from a plan: the same decisions, records and exits as the slow path,
    and the same sandbox: the work folder writable, execgate's home and the session folder
    not, a program a rule names (git: the default rules name it) covered by its stand-in."""
    witness = warm_ww.execgate_home / "witness"
    script = (
        f"touch made && echo made; touch {witness} || echo home-read-only; "
        'S=$(dirname "$EXECGATE_SOCKET"); (: >"$S/standins.table") 2>/dev/null || echo session-ro; '
        "git --version >/dev/null && echo git-ran; exit 4"
    )
    statuses = []
    for command in [("dash", "-c", script), ("dash", "-c", "kill -TERM $$")]:
        fast_status, fast_err, fast = run(warm_ww, *command, options=WW)
        statuses.append(fast_status)
        fast_records = log_records(warm_ww)
        slow_status, slow_err, slow = run(warm_ww, *command, options=WW, env=SLOW)
        slow_records = log_records(warm_ww)[len(fast_records) :]
        assert (fast, slow) == ("fast", "slow"), (fast_err, slow_err)
        assert (fast_status, fast_err) == (slow_status, slow_err)
        session = fast_records[-1]["session"]
        fast_records = [r for r in fast_records if r["session"] == session]
        strip = [{k: v for k, v in r.items() if k not in VARYING} for r in fast_records]
        assert strip == [{k: v for k, v in r.items() if k not in VARYING} for r in slow_records]
    assert statuses == [4, -signal.SIGTERM] and not witness.exists()
    process = start(warm_ww, "dash", "-c", FRONT_PARENT + script, options=WW)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 4, err
    assert out.decode().split("\n")[:5] == [
        "parent execgate-run", "made", "home-read-only", "session-ro", "git-ran"
    ]  # fmt: skip


def test_a_sandboxed_plan_goes_stale_with_what_its_sandbox_was_made_from(
    warm_ww: World, tmp_path: Path
) -> None:
    """What the sandbox is made from changed since the plan: the temporary folder (a
    writable root), a configured writable root, the link it is configured as, retargeted, a
    `.git` made in the work folder. The slow
    path starts the run, with the sandbox as it is now; the next run is fast again."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    config = warm_ww.execgate_home / "config.toml"
    extra, other, link = tmp_path / "extra", tmp_path / "other", tmp_path / "link"
    extra.mkdir()
    other.mkdir()
    link.symlink_to(extra)
    probe = f"touch {tmpdir}/w && echo tmpdir; touch {extra}/w && echo extra; "
    probe += f"touch {other}/w && echo other; touch .git/x && echo git-writable; true"

    def retarget() -> None:
        link.unlink()
        link.symlink_to(other)

    changes = [
        ("TMPDIR", {"TMPDIR": str(tmpdir)}, lambda: None, "tmpdir"),
        ("config", {}, lambda: config.write_text(f'[sandbox]\nwritable_roots = ["{link}"]\n'),
         "extra"),
        ("configured link", {}, retarget, "other"),
        (".git", {}, lambda: (warm_ww.work / ".git").mkdir(), None),
    ]  # fmt: skip
    env: dict[str, str] = {}
    for name, more, change, writable in changes:
        assert run(warm_ww, "dash", "-c", "true", options=WW, env=env)[2] == "fast", name
        env.update(more)
        change()
        for expected in ("slow", "fast"):
            process = start(warm_ww, "dash", "-c", probe, options=WW, env=env)
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, (name, err)
            first = [r for r in log_records(warm_ww) if r["argv"][-1:] == [probe]][-1]
            path = "fast" if first["ppid"] == process.pid else "slow"
            assert path == expected, (name, err)
            said = out.decode().split()
            assert "git-writable" not in said, name
            if writable:
                assert writable in said, (name, said, err)


def test_an_installation_inside_a_writable_root_starts_fast_and_stays_read_only(
    world: World,
) -> None:
    """execgate's own files inside a writable root (a `.venv` in the project, a clone under
    /tmp) are carved out of it the same way by the slow path and by the server of a fast
    start, which runs with `-I -S`: the plan covers the run, and the package cannot be
    written from inside on either path."""
    package = Path(execgate.__file__).resolve().parent
    (world.execgate_home / "config.toml").write_text(
        f'[sandbox]\nwritable_roots = ["{package.parent}"]\n'
    )
    beside = package.parent / f"egtest-{uuid.uuid4().hex}"
    probe = (
        f"touch {package}/planted && echo planted; "
        f"touch {beside} && rm {beside} && echo root-writable; true"
    )
    try:
        for expected in ("slow", "fast", "fast"):
            process = start(world, "dash", "-c", probe, options=WW)
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, err
            first = [r for r in log_records(world) if r["argv"][-1:] == [probe]][-1]
            assert ("fast" if first["ppid"] == process.pid else "slow") == expected, err
            assert out.decode().split() == ["root-writable"], err
            assert not (package / "planted").exists()
    finally:
        for made in (package / "planted", beside):
            made.unlink(missing_ok=True)
    (plan,) = plan_files(world)  # the launcher is told so
    assert f"launch --readonly\nlaunch {runplan.escape(str(package))}\n" in plan.read_text()


def test_a_plan_is_followed_only_by_the_front_it_was_written_for(
    warm: World, tmp_path: Path
) -> None:
    """Two installations never follow each other's plans (the user runs the one they asked
    for, whatever the other's version): a plan names its front and is filed under it, so a
    second front (a copy of this one, as another installation would have) starts the slow way
    and writes its own; a plan moved under the other front's name is refused by its line."""
    other = tmp_path / "elsewhere" / "execgate-run"
    other.parent.mkdir()
    front = Path(execgate.__file__).parent / "_bin" / "execgate-run"  # python -m execgate's
    shutil.copy2(front, other)
    elsewhere = (str(other), sys.executable)  # `execgate-run PYTHON ARGS`, as python -m starts it
    (ours,) = plan_files(warm)
    assert runplan.parse(ours.read_text()).front == os.path.realpath(front)
    assert run(warm, "dash", "-c", "true", execgate=elsewhere)[::2] == (0, "slow")
    theirs = next(plan for plan in plan_files(warm) if plan != ours)
    assert runplan.parse(theirs.read_text()).front == str(other)
    assert run(warm, "dash", "-c", "true", execgate=elsewhere)[::2] == (0, "fast")
    assert run(warm, "dash", "-c", "true")[::2] == (0, "fast")  # ours is still ours
    theirs.unlink()
    ours.rename(theirs)  # our plan under the other front's name: its `front` line says no
    assert run(warm, "dash", "-c", "true", execgate=elsewhere)[::2] == (0, "slow")


def test_a_plan_for_another_working_directory_is_not_followed(warm_ww: World) -> None:
    """The plan's name is an index: a plan made for one folder, put where another folder's
    plan would be, is not followed there (the writable root would be the first folder)."""
    (plan,) = plan_files(warm_ww)
    other = warm_ww.work.parent / "other"
    other.mkdir()
    front = runplan.parse(plan.read_text()).front
    key = runplan.plan_key(os.getuid(), front, str(other), list(WW))
    plan.rename(plan.with_name(key))
    status, err, path = run(warm_ww, "dash", "-c", "touch made", options=WW, cwd=other)
    assert (status, path) == (0, "slow"), err
    assert (other / "made").exists()
