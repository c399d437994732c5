"""execgate-launch through its Python client: spawning (descriptors, argv, env, cwd, process
groups), exit statuses, signals, failures, and what happens when things go wrong."""

from __future__ import annotations

import asyncio
import errno
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from egtest_launch import PYTHON, alive, env_list, run, run_in, sh

from execgate.gate.launcher import Launcher, LauncherError, SpawnError
from execgate.gate.protocol import HEADER


async def started(new_session: bool = True) -> Launcher:
    return await Launcher.start(None, new_session=new_session)


def test_descriptors_are_placed_exactly_and_nothing_else_is_inherited(tmp_path: Path) -> None:
    # Six files placed at 3..8 in an order that makes targets collide with the numbers the
    # launcher receives them at; each target writes its own number into its file.
    files = [open(tmp_path / f"f{i}", "w+b") for i in range(6)]  # noqa: SIM115
    targets = {8 - i: f.fileno() for i, f in enumerate(files)}
    listing = (
        "import os\n"
        "fds = sorted(int(n) for n in os.listdir('/proc/self/fd'))\n"
        "def is_open(fd):\n"
        "    try: return os.fstat(fd) is not None\n"
        "    except OSError: return False\n"
        "mine = [fd for fd in fds if is_open(fd)]  # listdir's own descriptor is closed now\n"
        "print(mine)\n"
        "for fd in mine:\n"
        "    if fd > 2: os.write(fd, str(fd).encode())\n"
    )

    async def go() -> str:
        launcher = await started()
        try:
            # Another spawn in flight must not leak its descriptors either.
            other = await run_in(launcher, ["sleep", "0"])
            assert other.code == 0
            result = await run_in(launcher, [PYTHON, "-S", "-c", listing], fds=targets)
            assert result.code == 0, result
            return result.output
        finally:
            await launcher.shutdown()

    assert run(go).strip() == "[0, 1, 2, 3, 4, 5, 6, 7, 8]"
    for i, f in enumerate(files):
        f.seek(0)
        assert f.read() == str(8 - i).encode()
        f.close()


def test_argv_env_and_cwd_are_exact(tmp_path: Path) -> None:
    argv = ["printf", "<%s>", "a", "", "b c", "-", "\u00e9"]

    async def go() -> tuple[str, str, str]:
        launcher = await started()
        try:
            printed = await run_in(launcher, argv)
            raw = await launcher.spawn(
                path=b"/usr/bin/printf",
                argv=[b"printf", b"<%s>", b"\xff\xfe", b""],
                env=[],
                cwd=b"/",
                fds={1: (out := os.open(tmp_path / "raw", os.O_WRONLY | os.O_CREAT))},
                sandboxed=False,
            )
            os.close(out)
            assert await raw.wait() == 0
            env = await run_in(launcher, ["/usr/bin/env"], env={"A": "1", "EMPTY": "", "B": "x=y"})
            cwd = await run_in(launcher, ["/bin/pwd"], cwd=tmp_path)
            return printed.output, env.output, cwd.output
        finally:
            await launcher.shutdown()

    printed, env, cwd = run(go)
    assert printed == "<a><><b c><-><\u00e9>"
    assert (tmp_path / "raw").read_bytes() == b"<\xff\xfe><>"
    assert env.splitlines() == ["A=1", "EMPTY=", "B=x=y"]
    assert cwd.strip() == str(tmp_path)


def test_exit_statuses_are_raw_wait_statuses() -> None:
    async def go() -> list[int]:
        launcher = await started()
        try:
            results = [
                await sh(launcher, "exit 0"),
                await sh(launcher, "exit 3"),
                await sh(launcher, "exit 255"),
                await sh(launcher, "kill -KILL $$"),
                await sh(launcher, "kill -USR1 $$"),
            ]
            return [r.status for r in results]
        finally:
            await launcher.shutdown()

    statuses = run(go)
    assert [os.waitstatus_to_exitcode(s) for s in statuses] == [0, 3, 255, -9, -10]
    assert os.WIFSIGNALED(statuses[3]) and os.WTERMSIG(statuses[3]) == signal.SIGKILL


def test_children_get_default_signal_dispositions_and_an_empty_mask() -> None:
    async def go() -> str:
        launcher = await started()
        try:
            return (await sh(launcher, "grep -E '^Sig(Ign|Blk):' /proc/self/status")).output
        finally:
            await launcher.shutdown()

    lines = run(go).split()
    assert lines == ["SigBlk:", "0000000000000000", "SigIgn:", "0000000000000000"]


def test_signal_reaches_the_process_and_is_a_no_op_after_it_ended() -> None:
    async def go() -> int:
        launcher = await started()
        try:
            with open(os.devnull, "r+b") as null:
                fds = {0: null.fileno(), 1: null.fileno(), 2: null.fileno()}
                proc = await launcher.spawn(
                    path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                    fds=fds, sandboxed=False,
                )  # fmt: skip
            proc.signal(signal.SIGTERM)
            status = await proc.wait()
            proc.signal(signal.SIGTERM)  # ended: nothing is sent, nothing breaks
            with pytest.raises(ValueError):
                proc.signal(0)
            return status
        finally:
            await launcher.shutdown()

    assert os.waitstatus_to_exitcode(run(go)) == -signal.SIGTERM


def test_the_launcher_ignores_terminal_signals() -> None:
    async def go() -> tuple[str, int]:
        launcher = await started()
        try:
            for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP):
                os.kill(launcher.pid, signum)
            await asyncio.sleep(0.05)
            with open(f"/proc/{launcher.pid}/status") as f:
                ignored = next(line for line in f if line.startswith("SigIgn:")).split()[1]
            return ignored, (await sh(launcher, "exit 7")).code
        finally:
            await launcher.shutdown()

    ignored, code = run(go)
    mask = int(ignored, 16)
    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP):
        assert mask & (1 << (signum - 1)), signum
    assert code == 7


PGRP = f"{PYTHON} -S -c 'import os; print(os.getpid(), os.getpgrp())'"


def test_process_groups_new_inherit_join_and_fallback() -> None:
    async def go() -> dict[str, tuple[int, int]]:
        launcher = await started(new_session=True)
        try:
            got = {}
            for name, pgid in (("inherit", -1), ("new", 0)):
                out = (await sh(launcher, f"exec {PGRP}", pgid=pgid)).output
                pid, group = map(int, out.split())
                got[name] = (pid, group)
            with open(os.devnull, "r+b") as null:
                leader = await launcher.spawn(
                    path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                    fds={0: null.fileno()}, sandboxed=False, pgid=0,
                )  # fmt: skip
            out = (await sh(launcher, f"exec {PGRP}", pgid=leader.pid)).output
            got["join"] = tuple(map(int, out.split()))  # type: ignore[assignment]
            got["leader"] = (leader.pid, leader.pid)
            # Group 1 (init's) is in another session: not joinable, so a new group.
            out = (await sh(launcher, f"exec {PGRP}", pgid=1)).output
            got["fallback"] = tuple(map(int, out.split()))  # type: ignore[assignment]
            got["launcher"] = (launcher.pid, os.getpgid(launcher.pid))
            return got
        finally:
            await launcher.shutdown()

    got = run(go)
    assert got["launcher"][1] == got["launcher"][0]  # new_session: its own group
    assert got["inherit"][1] == got["launcher"][0]
    assert got["new"][1] == got["new"][0]
    assert got["join"][1] == got["leader"][0]
    assert got["fallback"][1] == got["fallback"][0]


def test_spawn_failures_carry_errno_and_message_and_run_nothing(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("data\n")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF-not-really")
    garbage.chmod(0o755)

    async def attempt(launcher: Launcher, path: str, cwd: str = "/") -> SpawnError:
        with pytest.raises(SpawnError) as info:
            await launcher.spawn(
                path=os.fsencode(path), argv=[b"x"], env=[], cwd=os.fsencode(cwd), fds={},
                sandboxed=False,
            )  # fmt: skip
        return info.value

    async def go() -> list[SpawnError]:
        launcher = await started()
        try:
            errors = [
                await attempt(launcher, "/nonexistent/program"),
                await attempt(launcher, str(plain)),
                await attempt(launcher, str(garbage)),
                await attempt(launcher, "/bin/true", cwd=str(tmp_path / "missing")),
            ]
            assert (await sh(launcher, "exit 5")).code == 5  # still serving
            return errors
        finally:
            await launcher.shutdown()

    missing, not_exec, bad_format, bad_cwd = run(go)
    assert missing.errno == errno.ENOENT and "exec /nonexistent/program" in str(missing)
    assert not_exec.errno == errno.EACCES
    assert bad_format.errno == errno.ENOEXEC
    assert bad_cwd.errno == errno.ENOENT and str(bad_cwd).startswith("chdir ")


def test_many_concurrent_spawns_each_get_their_own_status() -> None:
    async def go() -> list[int]:
        launcher = await started()
        try:
            results = await asyncio.gather(*(sh(launcher, f"exit {i}") for i in range(60)))
            return [r.code for r in results]
        finally:
            await launcher.shutdown()

    assert run(go) == list(range(60))


def test_spawn_after_shutdown_is_refused_and_shutdown_is_idempotent() -> None:
    async def go() -> None:
        launcher = await started()
        await launcher.shutdown()
        await launcher.shutdown()
        assert not launcher.running
        with pytest.raises(LauncherError):
            await sh(launcher, "true")

    run(go)


def test_a_malformed_control_message_ends_the_session() -> None:
    async def go() -> tuple[int, bool]:
        launcher = await started()
        with open(os.devnull, "r+b") as null:
            proc = await launcher.spawn(
                path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                fds={0: null.fileno()}, sandboxed=False,
            )  # fmt: skip
        payload = b"EG1\0bogus\0"
        await launcher._channel.send(HEADER.pack(len(payload)) + payload)
        status = await asyncio.wait_for(asyncio.shield(launcher._exit), 10)
        await launcher.shutdown()
        return status, alive(proc.pid)

    status, still_alive = run(go)
    assert status == 0
    assert not still_alive


def test_children_die_with_a_killed_launcher() -> None:
    # SIGKILL leaves no chance to clean up; PR_SET_PDEATHSIG still takes the direct children.
    async def go() -> tuple[bool, str]:
        launcher = await started()
        with open(os.devnull, "r+b") as null:
            proc = await launcher.spawn(
                path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                fds={0: null.fileno()}, sandboxed=False,
            )  # fmt: skip
        pidfd = os.pidfd_open(proc.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        gone = bool(select.select([pidfd], [], [], 10)[0])
        os.close(pidfd)
        try:
            await proc.wait()
            outcome = "status"
        except LauncherError as exc:
            outcome = str(exc)
        await launcher.shutdown()
        return gone, outcome

    gone, outcome = run(go)
    assert gone
    assert "launcher" in outcome


def test_the_launcher_ends_by_itself_once_its_last_program_and_all_it_left_are_gone() -> None:
    """``last``: after that program exits, the launcher exits (status 0) as soon as no process
    of the session is left, without a ``shutdown`` — not while a background child it left
    still runs, and not after other programs exit."""

    async def go() -> None:
        launcher = await started()
        other = await sh(launcher, "exit 3", sandboxed=False)
        assert other.code == 3
        r, w = os.pipe()
        with open(os.devnull, "r+b") as null:
            main = await launcher.spawn(
                path=b"/bin/sh", argv=[b"sh", b"-c", b"sleep 100 & echo $!"], env=env_list(),
                cwd=b"/", fds={0: null.fileno(), 1: w}, sandboxed=False, main=True, last=True,
            )  # fmt: skip
        os.close(w)
        assert await main.wait() == 0  # reported before the launcher goes
        left = int(os.read(r, 100).decode())
        os.close(r)
        await asyncio.sleep(0.3)
        assert alive(left) and not launcher._exit.done()  # its leftover still runs
        os.kill(left, signal.SIGKILL)
        assert await asyncio.wait_for(asyncio.shield(launcher._exit), 30) == 0
        assert not alive(left)
        await launcher.shutdown()  # still fine to call

    run(go)


#: A chain of subshells that never stops: each forks the next and exits (the chain's pids keep
#: changing, and one of them is always alive or a zombie not yet reaped).
HOPPING = "hop() { ( i=0; while [ $i -lt 50 ]; do i=$((i+1)); done; hop ) & }; hop"


@pytest.mark.parametrize("left", ["nothing", "a child", "a hopping chain"])
def test_ended_precedes_the_last_programs_exit_only_when_nothing_is_left(left: str) -> None:
    """``ended`` (protocol §7) is read before the ``exited`` of the ``last`` program exactly
    when the launcher had no child left as it reaped it: then it exits 0 at once. A child the
    program left, even a chain of processes that fork and exit to slip through, means no
    ``ended``: the launcher stays until ``shutdown`` kills them (a front end answers early
    only on ``ended``)."""
    script = {"nothing": "exit 5", "a child": "sleep 100 & exit 5", "a hopping chain": HOPPING}

    async def go() -> None:
        for _ in range(3 if left == "a hopping chain" else 1):  # the chain at other points
            launcher = await started()
            with open(os.devnull, "r+b") as null:
                main = await launcher.spawn(
                    path=b"/bin/sh", argv=[b"sh", b"-c", script[left].encode()], env=env_list(),
                    cwd=b"/", fds={0: null.fileno(), 1: null.fileno(), 2: null.fileno()},
                    sandboxed=False, main=True, last=True,
                )  # fmt: skip
            await main.wait()
            if left == "nothing":
                assert launcher.ended  # read before the exit status
                assert await asyncio.wait_for(asyncio.shield(launcher._exit), 30) == 0
            else:
                assert not launcher.ended
                assert not launcher._exit.done()
            await launcher.shutdown()
            assert not launcher.ended or left == "nothing"

    run(go)


SCENARIO = Path(__file__).with_name("subreaper_scenario.py")


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
@pytest.mark.parametrize("scenario", ["shutdown", "eof", "sigterm", "forkbomb"])
def test_end_of_session_kills_every_descendant_and_leaves_no_zombie(
    scenario: str, sandboxed: bool
) -> None:
    """setsid'ed, double-forked, SIGTERM-ignoring, nohup'ed and respawning descendants all
    die, whatever ends the session; nothing is left for the parent (a subreaper) to reap."""
    import json

    args = [sys.executable, str(SCENARIO), scenario] + (["--sandboxed"] if sandboxed else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["survivors"] == []
    assert result["left_to_us"] == []
    assert result["launcher_status"] == 0
    if scenario == "forkbomb":
        assert result["descendants"] > 50  # FORKBOMB_POPULATION
    if scenario in ("shutdown", "sigterm", "forkbomb"):
        assert result["main_status"] == signal.SIGTERM  # reported before the launcher exits
    assert result["elapsed"] < 60  # ends, not hangs: a bound, not a speed test


MAIN_TTY = r"""
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
from execgate.gate.launcher import Launcher
from egtest_launch import env_list, PYTHON

async def go():
    tty = os.open(os.ttyname(0), os.O_RDWR)
    launcher = await Launcher.start(None, new_session=False)
    probe = "import os; print(os.tcgetpgrp(0) == os.getpgrp(), os.getpgrp() == os.getpid())"
    r, w = os.pipe()
    argv = [b"python3", b"-S", b"-c", probe.encode()]
    proc = await launcher.spawn(path=PYTHON.encode(), argv=argv, env=env_list(), cwd=b"/",
                                fds={0: tty, 1: w}, sandboxed=False, pgid=0, main=True)
    os.close(w)
    await proc.wait()
    seen = os.read(r, 100).decode().split()
    back = os.tcgetpgrp(tty) == os.getpgrp()
    await launcher.shutdown()
    print(seen[0], seen[1], back)

asyncio.run(go())
"""


def test_main_spawn_gets_the_terminal_and_gives_it_back() -> None:
    import pty

    leader, follower = pty.openpty()
    here = str(Path(__file__).resolve().parent)

    def controlling_tty() -> None:  # runs in the child: new session, the pty as its terminal
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    with tempfile.TemporaryFile() as out:
        done = subprocess.run(
            [sys.executable, "-c", MAIN_TTY, here],
            stdin=follower,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=controlling_tty,
            timeout=60,
        )
        out.seek(0)
        text = out.read().decode()
    os.close(leader)
    os.close(follower)
    assert done.returncode == 0, text
    assert text.split() == ["True", "True", "True"]
