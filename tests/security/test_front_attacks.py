"""Attacks on the native front of ``execgate run`` (``execgate-run``, docs/protocol.md §8): the
command started from a cached start-up plan while the Python server starts in parallel.
Performed for real, as root and as the unprivileged user.

With the sandbox off the user's files are the gated processes' to write (docs/threat-model.md
"Sandbox off is cooperative"), so a plan forged from inside a sandbox-off session is no more
than what such a process can already do; what must hold is that a sandboxed session cannot
reach the plans at all, and that a plan that no longer matches its inputs never lets anything
run that the inputs forbid — not even in the window before the server has checked it.

The tests of the front are skipped when this checkout has none (the ``front`` branch not merged
yet); the first program's race is also the slow path's, and runs either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import execgate
from execgate.gate import runplan

FRONT = Path(execgate.__file__).resolve().parent / "_bin" / "execgate-run"
needs_front = pytest.mark.skipif(
    not FRONT.exists(), reason="no native front (_bin/execgate-run): the front branch is not here"
)

FORBID = 'prefix_rule(["marker"], "forbidden", justification="marker must not run")\n'
HARMLESS = 'prefix_rule(["git", "push"], "prompt")\n'


def _plans(attacker: Any) -> list[Path]:
    folder = attacker.base / "xhome" / "cache" / "run-plans"
    return sorted(folder.iterdir()) if folder.exists() else []


def _records(attacker: Any) -> list[dict[str, Any]]:
    path = attacker.base / "xhome" / "log" / "decisions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


# The front takes only a first program the snapshot lets run without a question: one with a
# single link (bash often has two), so the commands here are `dash -c`. `front` in the output
# says the command was started by the native front (the launcher's parent is execgate-run).
WHICH = (
    'F=$(cut -d" " -f4 /proc/$PPID/stat); '
    '[ "$(cat /proc/$F/comm)" != execgate-run ] || echo front; '
)


def _gated(
    attacker: Any,
    script: str,
    *,
    options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    sandbox: str = "off",
) -> subprocess.CompletedProcess[bytes]:
    """``execgate run OPTIONS --sandbox SANDBOX -- dash -c SCRIPT`` as the attacker, in its
    work."""
    argv = [sys.executable, "-m", "execgate", "run", *options, "--sandbox", sandbox,
            "--", "dash", "-c", script]  # fmt: skip
    full_env = {**attacker.env, **(env or {})}
    if attacker.user is not None:
        argv = attacker.user.argv(argv)
    return subprocess.run(argv, env=full_env, cwd=attacker.work, capture_output=True, timeout=60)


def _warm(attacker: Any, options: tuple[str, ...] = (), sandbox: str = "off") -> Path:
    """Slow runs until the front starts one from the plan written for these options; the plan."""
    for _ in range(3):
        done = _gated(attacker, WHICH, options=options, sandbox=sandbox)
        assert done.returncode == 0, done
        if b"front" in done.stdout:
            (plan,) = [p for p in _plans(attacker) if p.stat().st_mtime_ns == _newest(attacker)]
            return plan
    raise AssertionError(f"the front never started a run: {done}")


def _newest(attacker: Any) -> int:
    return max(p.stat().st_mtime_ns for p in _plans(attacker))


# -- the plan from inside a sandbox --------------------------------------------------------------


@needs_front
def test_a_sandboxed_session_cannot_plant_or_replace_a_start_up_plan(attacker: Any) -> None:
    """A workspace-write session tries to replace the plan a later `--sandbox off` run would
    follow (its snapshot says what needs no question), to remove it, or to plant one in a
    plans folder of its own making: the cache is read-only inside."""
    plan = _warm(attacker)
    before = plan.read_bytes(), plan.stat().st_ino
    folder = plan.parent
    script = f"""
        cp {plan} forged && sed -i 's/^snapshot .*/snapshot 00/' forged
        cat forged > {plan}; echo "overwrite $?"
        mv -f forged {plan}; echo "rename $?"
        rm -f {plan}; echo "remove $?"
        mv {folder} {folder}.old; echo "move folder $?"
        echo still working
    """
    done = attacker.run(script, mode="workspace-write")
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    for what in ("overwrite", "rename", "remove", "move folder"):
        assert f"{what} 0" not in text, text
    assert (plan.read_bytes(), plan.stat().st_ino) == before


# -- a plan that no longer matches what it was made from -----------------------------------------


def _stale_cases(
    attacker: Any,
) -> list[tuple[str, tuple[str, ...], dict[str, str], Callable[[], None]]]:
    """(name, run options, change): each change makes `marker` forbidden in a way the plan
    (written before it, with a snapshot that names no `marker`) must notice."""
    xhome, xsys, work = attacker.base / "xhome", attacker.base / "xsys", attacker.work
    other_codex = attacker.base / "other-codex"

    def user_rules_folder() -> None:  # a rules folder that did not exist
        (xhome / "rules").mkdir()
        (xhome / "rules" / "new.rules").write_text(FORBID)

    def admin_requirements() -> None:  # the admin's requirements file appears
        (xsys / "requirements.toml").write_text(
            '[rules]\nprefix_rules = [\n  { pattern = [{ token = "marker" }], '
            'decision = "forbidden", justification = "admin" },\n]\n'
        )

    def codex_home_moved() -> None:  # a variable the opening reads (CODEX_HOME)
        (other_codex / "rules").mkdir(parents=True)
        (other_codex / "rules" / "default.rules").write_text(FORBID)

    def rules_link_retargeted() -> None:  # --rules names a link; the link now points elsewhere
        (work / "strict.rules").write_text(FORBID)
        (work / "link.rules").unlink()
        (work / "link.rules").symlink_to(work / "strict.rules")

    def rules_folder_link() -> None:  # a folder of the --rules path is a link, retargeted
        (work / "strict").mkdir()
        (work / "strict" / "r.rules").write_text(FORBID)
        (work / "dir").unlink()
        (work / "dir").symlink_to(work / "strict")

    def same_size_rewrite() -> None:  # same inode, same size: only the times tell
        text = (work / "same.rules").read_text()
        (work / "same.rules").write_text(FORBID[: len(text)].ljust(len(text)))

    (work / "loose.rules").write_text(HARMLESS)
    (work / "link.rules").symlink_to(work / "loose.rules")
    (work / "loose").mkdir()
    (work / "loose" / "r.rules").write_text(HARMLESS)
    (work / "dir").symlink_to(work / "loose")
    # forbids marker once the trailing comment is cut (FORBID is the longer text)
    (work / "same.rules").write_text(HARMLESS.rstrip("\n").ljust(len(FORBID) - 1) + "\n")
    attacker.give(attacker.base)
    admin: list[tuple[str, tuple[str, ...], dict[str, str], Callable[[], None]]] = []
    if attacker.user is None:  # an ordinary user cannot move the admin folder
        admin.append(("admin requirements", (), {}, admin_requirements))
    return [
        ("user rules folder", (), {}, user_rules_folder),
        *admin,
        ("CODEX_HOME", (), {"CODEX_HOME": str(other_codex)}, codex_home_moved),
        ("--rules link", ("--rules", str(work / "link.rules")), {}, rules_link_retargeted),
        ("--rules folder link", ("--rules", str(work / "dir/r.rules")), {}, rules_folder_link),
        ("same size", ("--rules", str(work / "same.rules")), {}, same_size_rewrite),
    ]


@needs_front
@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_a_stale_plan_never_lets_a_newly_forbidden_program_run(attacker: Any, sandbox: str) -> None:
    """For each way the inputs can change after the plan was written, the next run's command
    runs `marker` at once (before the server could have checked anything): it must be denied,
    by the slow path (the front noticed) or by the server. In a sandbox the plan's stand-ins
    do not cover `marker` either: the plan must not be followed at all."""
    cases = _stale_cases(attacker)
    if sandbox != "off":  # the same checks of the same lines: a new folder, times only
        cases = [case for case in cases if case[0] in ("user rules folder", "same size")]
    for name, options, env, change in cases:
        _warm(attacker, options, sandbox)  # (CODEX_HOME is set for the attack run only)
        change()
        attacker.give(attacker.base)
        script = 'marker; echo "marker $?"'
        done = _gated(attacker, script, options=options, env=env, sandbox=sandbox)
        text = done.stdout.decode()
        assert not attacker.ran(), (name, text, done.stderr)
        assert "marker 126" in text or done.returncode != 0, (name, text, done.stderr)


# -- a sandboxed session started by the front -----------------------------------------------------

# Executes `marker` with the raw execve syscall: no interposer sees it, only the kernel (which
# finds the stand-in mounted over it, promise 23).
RAW_EXECVE = (
    "import ctypes, shutil; m = shutil.which('marker').encode(); "
    "argv = (ctypes.c_char_p * 2)(m, None); "
    "ctypes.CDLL(None).syscall(59, m, argv, None); print('raw execve failed')"
)


@needs_front
def test_a_fast_started_sandbox_covers_rule_named_programs_and_guards_its_session(
    attacker: Any,
) -> None:
    """In a workspace-write session the front started from a plan, the command attacks what
    the front made before the server was up: it executes the forbidden `marker` with a raw
    syscall (its stand-in must make the kernel ask), and tries to replace the stand-in table,
    a stand-in, the snapshot file and the plan itself. Nothing of it works; the session goes on."""
    options = ("--rules", str(attacker.rules))
    plan = _warm(attacker, options, "workspace-write")
    before = plan.read_bytes(), plan.stat().st_ino
    script = (
        WHICH
        + f"""
        S=$(dirname "$EXECGATE_SOCKET")
        python3 -c "{RAW_EXECVE}"; echo "raw $?"
        marker; echo "marker $?"
        (: >"$S/standins.table") 2>/dev/null; echo "table $?"
        (printf '#!/bin/sh\nexit 0\n' >"$S/standins/0") 2>/dev/null; echo "standin $?"
        (: >"$S/policy.snap") 2>/dev/null; echo "snapshot $?"
        mv -f "$S/standins" "$S/moved" 2>/dev/null; echo "move $?"
        (: >{plan}) 2>/dev/null; echo "plan $?"
        echo still working
    """
    )
    done = _gated(attacker, script, options=options, sandbox="workspace-write")
    text = done.stdout.decode()
    assert "front" in text and "still working" in text, (text, done.stderr)
    assert not attacker.ran(), (text, done.stderr)
    assert "marker 126" in text, text
    for what in ("table", "standin", "snapshot", "move", "plan"):
        assert f"{what} 0" not in text, text
    assert (plan.read_bytes(), plan.stat().st_ino) == before


# What a sandbox-off session's process may do to the user's files (cooperative): rewrite the
# workspace-write plan so the home folder is no longer read-only in that sandbox.
UNGUARD_HOME = """
import sys
path, home = sys.argv[1:3]
lines = open(path).read().split("\\n")
at = lines.index("launch " + home)
del lines[at - 1 : at + 1]
open(path, "w").write("\\n".join(lines))
"""


@needs_front
def test_a_forged_sandbox_plan_ends_the_session(attacker: Any) -> None:
    """A sandbox-off session (which may write the user's files) rewrites the workspace-write
    plan: execgate's home is no longer among the launcher's read-only paths. Every input still
    holds, so the front follows it; the server's recompute (the launcher's own command line
    against what it computes) ends the session before the command gets to write there, and
    deletes the plan."""
    options = ("--rules", str(attacker.rules))
    xhome = attacker.base / "xhome"
    witness = xhome / "witness"
    (attacker.work / "unguard.py").write_text(UNGUARD_HOME)
    attacker.give(attacker.work)
    for _ in range(3):  # (a folder the plan names, shared with other tests, may be remade)
        plan = _warm(attacker, options, "workspace-write")
        done = _gated(attacker, f"python3 unguard.py {plan} {xhome}", options=options)
        assert done.returncode == 0, done
        assert f"launch {xhome}\n".encode() not in plan.read_bytes()
        script = WHICH + f"sleep 30; touch {witness} && echo wrote"
        done = _gated(attacker, script, options=options, sandbox="workspace-write")
        assert b"wrote" not in done.stdout and not witness.exists(), done
        if b"front" in done.stdout:
            break
    assert b"front" in done.stdout, done
    assert done.returncode == 1, done
    assert b"its start-up plan was stale (the launcher's options differ)" in done.stderr
    assert not plan.exists()


# The slow path reads the rules at its start and lists their identities in the plan when it
# writes it, once its session is open: an edit in between is listed, its rules are not.
INOTIFY_IN_CLOSE_NOWRITE = 0x10


def _rewrite_after_first_read(path: Path, text: str) -> Any:
    """A watcher that, once ``path`` has been read and closed, stops the process it is given
    (SIGSTOP: the edit lands before it goes on), rewrites the file in place and resumes it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0
    assert libc.inotify_add_watch(fd, os.fsencode(path), INOTIFY_IN_CLOSE_NOWRITE) >= 0
    edited = threading.Event()
    process: list[subprocess.Popen[bytes]] = []

    def watch() -> None:
        try:
            data = os.read(fd, 4096)  # the loader read the file (and closed it)
            assert struct.unpack_from("iIII", data)[1] & INOTIFY_IN_CLOSE_NOWRITE
            os.kill(process[0].pid, signal.SIGSTOP)
            with open(path, "r+") as f:  # in place: the same inode
                f.write(text)
                f.truncate()
            os.kill(process[0].pid, signal.SIGCONT)
            edited.set()
        finally:
            os.close(fd)

    return process, threading.Thread(target=watch, daemon=True), edited


@needs_front
def test_rules_edited_while_the_slow_path_opens_never_make_a_stale_plan(attacker: Any) -> None:
    """The user tightens a rules file while a run is starting (after its policy was read,
    before the plan is written): the plan must not pair the new file's identity with the old
    rules' snapshot, or the next run follows it and runs `marker` before its server notices."""
    rules = attacker.work / "edited.rules"
    rules.write_text(HARMLESS)
    attacker.give(attacker.base)
    options = ("--rules", str(rules))
    process, watcher, edited = _rewrite_after_first_read(rules, FORBID)
    argv = [sys.executable, "-m", "execgate", "run", *options, "--sandbox", "off",
            "--", "dash", "-c", "true"]  # fmt: skip
    process.append(
        subprocess.Popen(
            attacker.user.argv(argv) if attacker.user else argv,
            env={**attacker.env, "EXECGATE_FAST_START": "0"},
            cwd=attacker.work,
        )
    )
    watcher.start()
    assert process[0].wait(timeout=60) == 0
    watcher.join(timeout=30)
    assert edited.is_set()
    done = _gated(attacker, WHICH + 'marker; echo "marker $?"', options=options)
    assert not attacker.ran(), (done.stdout, done.stderr)


# -- the first program ---------------------------------------------------------------------------

SWAP = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop = (os.fsencode(p) for p in sys.argv[1:4])
while not os.path.exists(stop):
    libc.renameat2(-100, a, -100, b, 2)  # RENAME_EXCHANGE
"""


@pytest.mark.parametrize("path", [pytest.param("fast", marks=[needs_front]), "slow"])
def test_a_first_program_swapped_after_its_check_never_runs(attacker: Any, path: str) -> None:
    """`./first` is a harmless program when the front (or the slow path) judges it and a copy
    of the forbidden `marker` (judged by its content, promise 17a) when the launcher executes
    it by path: another process of the user (a concurrent session's, say) exchanges the two
    files all the time. The first program must be the file that was judged."""
    work = attacker.work
    shutil.copy(attacker.bin / "marker", work / "evil")
    shutil.copy("/bin/true", work / "first")
    (work / "swap.py").write_text(SWAP)
    attacker.give(attacker.base)
    if path == "fast":
        _warm(attacker, ("--rules", str(attacker.rules)))
    stop = work / "stop"
    argv = [shutil.which("python3") or "python3", str(work / "swap.py"),
            str(work / "first"), str(work / "evil"), str(stop)]  # fmt: skip
    swapper = subprocess.Popen(attacker.user.argv(argv) if attacker.user else argv)
    try:
        env = {"EXECGATE_FAST_START": "0"} if path == "slow" else {}
        for _ in range(8):
            done = subprocess.run(
                attacker.user.argv(_run_argv(attacker)) if attacker.user else _run_argv(attacker),
                env={**attacker.env, **env}, cwd=work, capture_output=True, timeout=60,
            )  # fmt: skip
            if attacker.ran("first"):
                break
    finally:
        stop.touch()
        swapper.wait(timeout=30)
    assert not attacker.ran("first"), done


def _run_argv(attacker: Any) -> list[str]:
    import sys

    return [sys.executable, "-m", "execgate", "run", "--rules", str(attacker.rules),
            "--sandbox", "off", "--", "./first"]  # fmt: skip


# -- killing the server before it is up ------------------------------------------------------------


@needs_front
def test_killing_the_server_at_once_leaves_no_unrecorded_program(attacker: Any) -> None:
    """The command kills the server the front forked (its pid is in EXECGATE_SNAPSHOT) before
    the server has written the first program's decision record: every exec after that is
    denied, but the program that ran must still be in the decision log (promise 17b)."""
    _warm(attacker)
    before = len(_records(attacker))
    script = 'S=${EXECGATE_SNAPSHOT#/proc/}; kill -KILL "${S%%/*}"; echo killed'
    done = _gated(attacker, script)
    assert b"killed" in done.stdout, done
    ran = [r for r in _records(attacker)[before:] if r.get("argv", [None])[0] == "dash"]
    assert ran, (done.stdout, done.stderr)


# -- the decision log the front writes the first record to ---------------------------------------


@needs_front
@pytest.mark.parametrize("replacement", ["fifo", "folder"])
def test_a_log_swapped_by_a_command_stops_the_next_run_before_it_runs(
    attacker: Any, replacement: str
) -> None:
    """A gated command replaces the decision log with a FIFO (a writer that waited for a
    reader would hang the next front before its command ran) or a folder. The next run's front
    cannot write the first record: its command must not run unrecorded; the slow path refuses
    the log in one sentence, at once."""
    _warm(attacker)
    log = attacker.base / "xhome" / "log" / "decisions.jsonl"
    make = "os.mkfifo(p)" if replacement == "fifo" else "os.mkdir(p)"
    swap = f'python3 -c "import os; p = {str(log)!r}; os.unlink(p); {make}"; echo swapped'
    assert b"swapped" in _gated(attacker, swap).stdout
    assert not log.is_file()
    marker = attacker.work / "ran"
    done = _gated(attacker, f"touch {marker}")  # (a hang fails: _gated's timeout)
    assert not marker.exists(), done
    assert done.returncode == 1, done
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith(f"execgate: error: cannot write the decision log {log}: "), line


@needs_front
def test_a_plan_that_points_the_log_elsewhere_ends_its_session(attacker: Any) -> None:
    """A plan (the user's own file: with the sandbox off, cooperative) whose decision log is
    another file: the front writes the first record where the plan says, before the command
    runs, and the server, which computes the log itself, ends the session at once."""
    plan = _warm(attacker)
    elsewhere = attacker.outside / "elsewhere.jsonl"
    lines = [
        f"server log {runplan.escape(str(elsewhere))} 100000 2" if line.startswith("server log ")
        else line
        for line in plan.read_text().splitlines()
    ]  # fmt: skip
    plan.write_text("\n".join(lines) + "\n")
    marker = attacker.work / "ran"
    done = _gated(attacker, f"sleep 20; touch {marker}")
    assert done.returncode == 1, done
    assert b"its start-up plan was stale (the decision log differs)" in done.stderr, done
    assert not marker.exists()
    assert not plan.exists()
    (first,) = [json.loads(line) for line in elsewhere.read_text().splitlines()]
    assert first["argv"][:2] == ["dash", "-c"]
