"""Held spawns (docs/protocol.md §7 "Held spawns", native/hold.h): a shell started ahead of its
call takes exactly the call it is released with, runs nothing before, and a hold is honoured
only through a socket the process's own parent made."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from egtest_launch import BIN, run

from execgate.gate.held import placeholder_argv, placeholder_env
from execgate.gate.launcher import LaunchedProcess, Launcher
from execgate.gate.protocol import encode_fields

BASH = "/usr/bin/bash"
PRELOAD = f"LD_PRELOAD={BIN / 'libexecgate.so'}".encode()
# No session: the interposer denies every exec, so the shells below run builtins only.
BASE_ENV = [PRELOAD, b"PATH=/usr/bin:/bin", b"LANG=C.UTF-8"]


async def held_bash(launcher: Launcher, devnull: int, path: str = BASH) -> LaunchedProcess:
    program = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return await launcher.spawn(
            path=path.encode(),
            argv=placeholder_argv(path.encode()),
            env=placeholder_env(BASE_ENV),
            cwd=b"/",
            fds={0: devnull, 1: devnull, 2: devnull},
            sandboxed=False,
            main=True,
            program=program,
            held=True,
        )
    finally:
        os.close(program)


def _strings(raw: bytes) -> list[bytes]:
    """NUL-separated strings as /proc shows them (the room left after them is NULs too)."""
    return raw.rstrip(b"\0").split(b"\0")


def test_a_held_shell_takes_exactly_the_call_it_is_released_with(tmp_path: Path) -> None:
    script = (
        'printf "%s\\n" "$0" "$#" "$BASH_EXECUTION_STRING" "$PWD" "$FOO" '
        '"${EXECGATE_HOLD-unset}" "${EXECGATE_HOLD_ROOM-unset}"; '
        'for f in /proc/$$/fd/*; do printf "%s " "${f##*/}"; done; echo; '
        "read -r line; exit 7"
    )

    async def go() -> None:
        launcher = await Launcher.start(None, new_session=True)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            shell = await held_bash(launcher, devnull)
            env = [*BASE_ENV, b"FOO=bar baz", f"PWD={tmp_path}".encode()]
            argv = [BASH.encode(), b"-c", script.encode()]
            await launcher.release(
                shell, argv=argv, env=env, cwd=os.fsencode(tmp_path),
                fds={0: stdin_r, 1: out_w, 2: out_w}, last=True,
            )  # fmt: skip
            os.close(out_w)
            printed = b""
            # everything before `read`: the seven values, then the descriptor list (until it
            # is printed, the shell's glob may hold /proc/$$/fd open at 3)
            while printed.count(b"\n") < 8:
                chunk = os.read(out_r, 4096)
                assert chunk, printed
                printed += chunk
            lines = printed.decode().splitlines()
            assert lines[:7] == [
                BASH, "0", script, str(tmp_path), "bar baz", "unset", "unset"
            ]  # fmt: skip
            # What /proc says of it is the call, not the placeholder (ps, pgrep read these).
            proc = Path(f"/proc/{shell.pid}")
            assert sorted(os.listdir(proc / "fd")) == ["0", "1", "2"]  # no hold socket left
            assert _strings((proc / "cmdline").read_bytes()) == argv
            assert _strings((proc / "environ").read_bytes()) == env
            assert os.readlink(proc / "cwd") == str(tmp_path)
            os.write(stdin_w, b"go\n")
            assert os.waitstatus_to_exitcode(await shell.wait()) == 7
        finally:
            for fd in (devnull, stdin_r, stdin_w, out_r):
                os.close(fd)
            await launcher.shutdown()

    run(go)


RECVMSG = {"x86_64": "47", "aarch64": "212"}[os.uname().machine]  # (its wait: native/hold.c)
# A program that never sets its locale, as dash: it must run in "C" whatever the environment.
LOCALE_PROBE = r"""
#include <locale.h>
#include <stdio.h>
int main(void) { printf("%s\n", setlocale(LC_ALL, NULL)); return 0; }
"""


def test_a_held_shell_has_its_locale_loaded_ahead_and_runs_in_the_one_its_call_says(
    tmp_path: Path,
) -> None:
    """The locale the placeholder's environment names is loaded while the shell waits (the
    shell's own setlocale then finds it loaded, native/hold.c); the locale in force is still
    the one the call's environment gives a shell that sets it (bash: the length of an
    "é" is one character in C.UTF-8, two bytes in C), and "C" for a program that sets none."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None, "a C compiler builds execgate's native part"
    probe = tmp_path / "locale-probe"
    source = tmp_path / "probe.c"
    source.write_text(LOCALE_PROBE)
    subprocess.run([compiler, "-o", str(probe), str(source)], check=True)
    length = b"x=\xc3\xa9; echo ${#x}"  # (the two bytes of "\u00e9")

    async def go() -> list[bytes]:
        launcher = await Launcher.start(None, new_session=True)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        printed = []
        try:
            calls = [
                (BASH, [b"-c", length], [b"LANG=C.UTF-8"]),
                (BASH, [b"-c", length], [b"LANG=C.UTF-8", b"LC_ALL=C"]),
                (str(probe), [b"-c", b""], [b"LANG=C.UTF-8"]),  # (the placeholder's argc)
            ]
            for path, args, locale in calls:
                shell = await held_bash(launcher, devnull, path)
                proc = Path(f"/proc/{shell.pid}")
                while (proc / "syscall").read_text().split()[0] != RECVMSG:
                    await asyncio.sleep(0.01)  # until it waits for its release
                assert "/LC_CTYPE" in (proc / "maps").read_text()  # loaded before
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                try:
                    env = [PRELOAD, b"PATH=/usr/bin:/bin", *locale]
                    await launcher.release(
                        shell, argv=[path.encode(), *args], env=env, cwd=b"/",
                        fds={0: devnull, 1: out_w, 2: out_w}, last=False,
                    )  # fmt: skip
                    os.close(out_w)
                    assert os.waitstatus_to_exitcode(await shell.wait()) == 0
                    printed.append(os.read(out_r, 4096))
                finally:
                    os.close(out_r)
        finally:
            os.close(devnull)
            await launcher.shutdown()
        return printed

    assert run(go) == [b"1\n", b"2\n", b"C\n"]


def test_a_held_shell_runs_nothing_before_or_without_its_release(tmp_path: Path) -> None:
    """The placeholder's command never runs: not while held, not when the release does not
    fit (exit 126 with a line saying why), not when the session ends first."""
    marker = tmp_path / "ran"

    async def go() -> None:
        launcher = await Launcher.start(None, new_session=True)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            unfit = await held_bash(launcher, devnull)
            await launcher.release(
                unfit, argv=[BASH.encode(), b"-c", f"echo > {marker}".encode(), b"extra"],
                env=BASE_ENV, cwd=b"/", fds={0: devnull, 1: devnull, 2: err_w}, last=False,
            )  # fmt: skip
            os.close(err_w)
            assert os.waitstatus_to_exitcode(await unfit.wait()) == 126
            said = os.read(err_r, 4096).decode()
            assert "the held shell cannot take its call" in said, said
            never = await held_bash(launcher, devnull)
        finally:
            os.close(devnull)
            os.close(err_r)
            await launcher.shutdown()
        assert never.returncode is not None  # ended with the session

    run(go)
    assert not marker.exists()


RELEASED = "echo released-by-the-socket-maker"
AS_EXECED = "echo ran-as-exec-ed"


def _hold_attempt(middle: bool) -> str:
    """bash -c AS_EXECED, asked to hold on a socket pair this process makes: as our child
    (we are its parent: the hold is honoured and we release it with RELEASED), or as the
    child of a middle process (not its parent's socket: ignored, it runs as exec'd)."""
    ours, theirs = socket.socketpair()
    hold = {"LD_PRELOAD": str(BIN / "libexecgate.so"), "EXECGATE_HOLD": "3"}
    env = {**hold, "PATH": "/bin"}
    target = [BASH, "-c", AS_EXECED + " " * 64]
    if middle:  # a Python in between forks the target: its parent is not the socket's maker
        code = "import os,sys; p=os.fork()\nif p == 0: os.execv(sys.argv[1], sys.argv[1:])\n"
        code += "os.waitpid(p, 0)"
        settings = [f"{k}={v}" for k, v in hold.items()]  # the target's alone
        target = [sys.executable, "-S", "-c", code, "/usr/bin/env", *settings, *target]
        env = {"PATH": "/bin"}
    out_r, out_w = os.pipe()
    child = os.posix_spawn(
        target[0],
        target,
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, theirs.fileno(), 3),
        ],
    )
    theirs.close()
    release = encode_fields(
        "release", [b"/"], [[1], [BASH.encode(), b"-c", RELEASED.encode()], [b"PATH=/bin"]]
    )
    try:
        if not middle:
            socket.send_fds(ours, [release], [out_w])
        os.close(out_w)
        os.waitpid(child, 0)
        return os.read(out_r, 4096).decode()
    finally:
        ours.close()
        os.close(out_r)


def test_a_hold_is_honoured_only_through_a_socket_the_parent_made() -> None:
    assert _hold_attempt(middle=False).strip() == "released-by-the-socket-maker"
    assert _hold_attempt(middle=True).strip() == "ran-as-exec-ed"


def test_a_hold_is_honoured_only_through_the_parents_socket_as_an_unprivileged_user(
    unprivileged: Any,
) -> None:
    here = Path(__file__).resolve().parent
    check = (
        f"import sys; sys.path[:0] = [{str(here)!r}]\n"
        "import test_launcher_held as t\n"
        "assert t._hold_attempt(middle=False).strip() == 'released-by-the-socket-maker'\n"
        "assert t._hold_attempt(middle=True).strip() == 'ran-as-exec-ed'\n"
        "print('ok')\n"
    )
    result = unprivileged.run([sys.executable, "-c", check], timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == b"ok", result
