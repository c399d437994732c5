"""Every exec entry point from a C program, system()/popen() semantics, threads and vfork,
program resolution (paths, links, PATH search, errors) and "what was checked is what runs"."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from .gateserver import Deny, Run
from .support import Gate, copy_binary, marker

EXEC_VIAS = [
    "execve",
    "execv",
    "execvp",
    "execvpe",
    "execl",
    "execlp",
    "execle",
    "execveat",
    "fexecve",
    "posix_spawn",
    "posix_spawnp",
]
PATH_VIAS = {"execvp", "execvpe", "execlp", "posix_spawnp"}


def prog_arg(gate: Gate, via: str, name: str) -> str:
    return name if via in PATH_VIAS else str(gate.bin / name)


@pytest.mark.parametrize("via", [*EXEC_VIAS, "fexecve-path"])
def test_entry_point_allowed(gate: Gate, cprog, via: str) -> None:  # type: ignore[no-untyped-def]
    r = gate.run([cprog("entry"), via, prog_arg(gate, via, "allowed"), "a b", ""])
    assert r.returncode == 0, r
    assert r.stdout == b"allowed:a b \n"
    req = gate.server.requests[0]
    assert req.via == via.replace("-path", "")
    assert req.argv[1:] == (b"a b", b"")
    assert req.realpath == str(gate.bin / "allowed").encode()
    st = os.stat(gate.bin / "allowed")
    assert (req.dev, req.ino) == (st.st_dev, st.st_ino)
    assert req.interp == b"/bin/sh"
    assert req.cwd == str(gate.work).encode()
    assert req.token == gate.server.token.encode()


@pytest.mark.parametrize("via", EXEC_VIAS)
def test_entry_point_denied(gate: Gate, cprog, via: str) -> None:  # type: ignore[no-untyped-def]
    r = gate.run([cprog("entry"), via, prog_arg(gate, via, "forbidden"), "x"])
    if via.startswith("posix_spawn"):
        # posix_spawn starts the wrapper, which decides in the child: the spawn succeeds and
        # the child exits 126 with the denial line (a path is never executed unchecked).
        assert r.returncode == 126 and r.stdout == b""
    else:
        assert r.returncode == 99
        assert r.stdout.startswith(b"errno=13")
    assert r.stderr.startswith(b"execgate: denied: ")
    assert r.stderr.endswith(b"forbidden x: forbidden by test rule\n")
    assert not gate.forbidden_ran()


def test_posix_spawn_with_closefrom(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    """A closefrom file action (CPython >= 3.13's close_fds) closes the descriptor the child
    would exec: it still runs (by path)."""
    r = gate.run([cprog("entry"), "posix_spawn-closefrom", "/bin/echo", "closefrom"])
    assert (r.returncode, r.stdout) == (0, b"closefrom\n")


def test_system(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    entry = cprog("entry")
    r = gate.run([entry, "system", "allowed sys; exit 7"])
    assert r.stdout == b"allowed:sys\nstatus=1792\n" and r.returncode == 7
    req = gate.server.requests[0]
    assert req.via == "system" and req.argv == (b"sh", b"-c", b"allowed sys; exit 7")
    assert req.path == b"/bin/sh"
    # the shell itself denied: status of a shell that exited 126
    gate.server.rule = lambda q: Deny("execgate: denied: no shells") if q.via == "system" else Run()
    r = gate.run([entry, "system", "allowed x"])
    assert r.stdout == b"status=32256\n" and r.stderr == b"execgate: denied: no shells\n"
    # the caller ignores SIGINT/SIGQUIT while the command runs
    gate.server.rule = lambda q: Run()
    r = gate.run([entry, "system-sigint", "-"])
    assert r.stdout == b"survived status=768\n"


def test_popen(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    entry = cprog("entry")
    r = gate.run([entry, "popen-r", "allowed from-popen; exit 5"])
    assert r.stdout == b"allowed:from-popen\nstatus=1280\n"
    assert gate.server.requests[0].via == "popen"
    r = gate.run([entry, "popen-w", "cat; exit 0"])
    assert r.stdout == b"data through popen\nstatus=0\n"
    r = gate.run([entry, "popen-chain", "-"])
    assert r.stdout == b"closed\nb=0 a=0\nforeign=0\n" or r.stdout.startswith(b"closed\nb=0 a=0\n")
    r = gate.run([entry, "popen-e", "-"])
    assert r.stdout == b"cloexec=1\nplain-cloexec=0\nbad-mode=1 errno=22\n"
    gate.server.rule = lambda q: Deny("execgate: denied: no popen") if q.via == "popen" else Run()
    r = gate.run([entry, "popen-r", "allowed x"])  # decided in the child: a shell exiting 126
    assert r.stdout == b"status=32256\n" and r.stderr == b"execgate: denied: no popen\n"


def test_threads_and_vfork(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    r = gate.run([cprog("threads"), "/bin/echo"])
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.decode().split())
    assert lines == sorted(f"t{t}-{i}" for t in range(8) for i in range(10))
    tags = sorted(q.argv[1].decode() for q in gate.server.requests)
    assert tags == lines  # every exec asked once, with its own argv
    assert {q.via for q in gate.server.requests} == {"execv", "posix_spawn"}


def test_paths_relative_symlink_hardlink(gate: Gate) -> None:
    w = gate.work
    (w / "sub").mkdir()
    os.symlink(gate.bin / "allowed", w / "sub" / "link")
    os.link(gate.bin / "allowed", w / "hard")
    r = gate.sh(
        "./bin/allowed rel; bin//allowed dbl; ../work/bin/allowed up; sub/link sym;"
        "./hard hl;"
        "cd sub && ./link sym2",
        cwd=w,
    )
    assert r.returncode == 0, r.stderr
    reqs = {q.argv[-1]: q for q in gate.server.requests}
    real = str(gate.bin / "allowed").encode()
    st = os.stat(gate.bin / "allowed")
    W = str(w).encode()
    assert reqs[b"rel"].path == W + b"/./bin/allowed"
    assert reqs[b"dbl"].path == W + b"/bin//allowed"
    assert reqs[b"up"].path == W + b"/../work/bin/allowed"
    assert reqs[b"sym"].path == W + b"/sub/link"
    assert reqs[b"sym2"].path == W + b"/sub/./link" and reqs[b"sym2"].cwd == W + b"/sub"
    assert reqs[b"hl"].path == W + b"/./hard" and reqs[b"hl"].realpath == W + b"/hard"
    for q in reqs.values():
        assert (q.dev, q.ino) == (st.st_dev, st.st_ino)
        if q is not reqs[b"hl"]:
            assert q.realpath == real


def test_symlink_to_forbidden_and_renamed_copy(gate: Gate) -> None:
    os.symlink(gate.bin / "forbidden", gate.work / "innocent")
    r = gate.sh("./innocent; echo rc=$?")
    assert b"rc=126" in r.stdout and not gate.forbidden_ran()


def test_symlink_swap_race_runs_the_checked_file(gate: Gate) -> None:
    """The server swaps the symlink while it decides: the exec must still run the file that
    was checked (an ELF runs from the descriptor that was opened)."""
    good = shutil.copy("/bin/echo", gate.work / "good")
    link = gate.work / "link"
    os.symlink(good, link)

    def swap(req):  # type: ignore[no-untyped-def]
        if req.path.endswith(b"/link"):
            tmp = gate.work / "link.tmp"
            os.symlink(gate.bin / "forbidden", tmp)
            os.replace(tmp, link)  # now link -> forbidden
        return Run()

    gate.server.rule = swap
    r = gate.sh("./link checked-file-ran")
    assert r.stdout == b"checked-file-ran\n"
    assert not gate.forbidden_ran()
    assert os.readlink(link) == str(gate.bin / "forbidden")


def test_directory_swap_race(gate: Gate) -> None:
    d1 = gate.work / "d1"
    d1.mkdir()
    shutil.copy("/bin/echo", d1 / "prog")
    d2 = gate.work / "d2"
    d2.mkdir()
    shutil.copy(gate.bin / "forbidden", d2 / "prog")
    os.symlink(d1, gate.work / "dir")

    def swap(req):  # type: ignore[no-untyped-def]
        if req.path.endswith(b"dir/prog"):
            os.symlink(d2, gate.work / "dir.tmp")
            os.replace(gate.work / "dir.tmp", gate.work / "dir")
        return Run()

    gate.server.rule = swap
    r = gate.sh("./dir/prog ok")
    assert r.stdout == b"ok\n" and not gate.forbidden_ran()


def test_not_found_errors_without_asking(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    entry = cprog("entry")
    (gate.work / "plain.txt").write_text("x")
    cases = {
        str(gate.work / "nope"): 2,  # ENOENT
        str(gate.work / "plain.txt" / "x"): 20,  # ENOTDIR
        str(gate.work / "plain.txt"): 13,  # EACCES: not executable
        str(gate.work): 13,  # EACCES: a directory
        "": 2,
    }
    for path, err in cases.items():
        r = gate.run([entry, "execve", path])
        assert r.stdout == f"errno={err}\n".encode(), (path, r)
        r = gate.run([entry, "posix_spawn", path])
        assert r.stdout.startswith(f"ret={err} ".encode()), (path, r)
    r = gate.run([entry, "execvp", "no-such-program-anywhere"])
    assert r.stdout == b"errno=2\n"
    assert gate.server.requests == []
    r = gate.sh("no-such-program-anywhere; echo rc=$?")
    assert b"rc=127" in r.stdout


def test_path_search_like_glibc(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    entry = cprog("entry")
    d1, d2 = gate.work / "d1", gate.work / "d2"
    d1.mkdir()
    d2.mkdir()
    (d1 / "tool").write_text("#!/bin/sh\necho d1\n")  # not executable: skipped (EACCES)
    marker(d2, "tool", "echo d2")
    env = dict(gate.env, PATH=f"{d1}:{d2}")
    for via in ("execvp", "execvpe", "execlp", "posix_spawnp"):
        r = gate.run([entry, via, "tool"], env=env)
        assert r.stdout == b"d2\n", (via, r)
    assert {q.path for q in gate.server.requests} == {str(d2 / "tool").encode()}
    # only the non-executable one: EACCES
    env = dict(gate.env, PATH=f"{d1}")
    r = gate.run([entry, "execvp", "tool"], env=env)
    assert r.stdout == b"errno=13\n"
    # empty PATH element: the current directory
    env = dict(gate.env, PATH=f"/nonexistent::{d1}")
    r = gate.run([entry, "execvp", "tool"], env=env, cwd=d2)
    assert r.stdout == b"d2\n"
    # PATH unset: /bin:/usr/bin
    env = {k: v for k, v in gate.env.items() if k != "PATH"}
    r = gate.run([entry, "execvp", "true"], env=env)
    assert r.returncode == 0 and gate.server.requests[-1].path == b"/bin/true"


def test_enoexec_falls_back_to_sh_gated(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    entry = cprog("entry")
    script = gate.work / "noshebang"
    script.write_text('echo no-shebang "$@"\n')
    script.chmod(0o755)
    env = dict(gate.env, PATH=f"{gate.work}:/usr/bin:/bin")
    r = gate.run([entry, "execvp", "noshebang", "arg"], env=env)
    assert r.stdout == b"no-shebang arg\n"
    reqs = gate.server.requests
    assert reqs[0].path == str(script).encode() and reqs[0].interp == b""
    assert reqs[1].path == b"/bin/sh" and reqs[1].argv == (b"/bin/sh", str(script).encode(), b"arg")
    # the fallback shell is itself gated
    gate.server.rule = lambda q: Deny("execgate: denied: sh") if q.path == b"/bin/sh" else Run()
    r = gate.run([entry, "execvp", "noshebang"], env=env)
    assert r.stdout == b"errno=13\n" and r.stderr == b"execgate: denied: sh\n"
    # execve does not fall back: ENOEXEC
    r = gate.run([entry, "execve", str(script)], env=env)
    assert r.stdout == b"errno=8\n"


def test_process_name_after_fd_exec(gate: Gate) -> None:
    code = (
        "import os; pid = os.posix_spawn('/bin/cat', ['cat', '/proc/self/comm'], os.environ);"
        "os.waitpid(pid, 0)"
    )
    r = gate.run(["python3", "-c", code])
    assert r.stdout == b"cat\n"
    r = gate.sh("/bin/cat /proc/self/comm")
    assert r.stdout == b"cat\n"


def test_large_argv_and_environment(gate: Gate) -> None:
    r = gate.sh("/bin/echo $(seq 1 30000) | wc -w")
    assert r.stdout.split() == [b"30000"]
    req = next(q for q in gate.server.requests if q.path == b"/bin/echo")
    assert len(req.argv) == 30001 and req.argv[-1] == b"30000"
    env = dict(gate.env, **{f"BIG{i}": "x" * 5000 for i in range(40)})
    r = gate.run(["bash", "-c", '/bin/sh -c "echo \\${#BIG39} \\$EXECGATE_TOKEN"'], env=env)
    assert r.stdout == f"5000 {gate.server.token}\n".encode()


def test_signal_while_asking_is_harmless(gate: Gate) -> None:
    """SIGCHLD etc. arriving during the round trip: recv is retried, the exec goes on."""
    r = gate.sh("(sleep 0 &); for i in 1 2 3; do /bin/true & done; wait; /bin/echo done")
    assert r.stdout == b"done\n"


def test_exec_from_signal_handler_context(gate: Gate) -> None:
    code = (
        "import os, signal\n"
        "def h(s, f): os.execv('/bin/echo', ['echo', 'from-handler'])\n"
        "signal.signal(signal.SIGUSR1, h)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
    )
    r = gate.run(["python3", "-c", code])
    assert r.stdout == b"from-handler\n"
    _ = signal


def test_script_swapped_during_check_runs_judged_interpreter(gate: Gate) -> None:
    """A script runs as its judged interpreter's descriptor: a path swapped for another
    program after the check is only read by that interpreter, never executed."""
    good = marker(gate.work, "good.sh", "echo good")
    link = gate.work / "s"
    os.symlink(good, link)
    elf = copy_binary("/bin/true", gate.bin / "forbidden-elf")

    def swap(req):  # type: ignore[no-untyped-def]
        if req.path.endswith(b"/s"):
            os.symlink(elf, gate.work / "s.tmp")
            os.replace(gate.work / "s.tmp", link)
        return Run()

    gate.server.rule = swap
    r = gate.sh("./s; echo rc=$?")
    assert b"rc=0" not in r.stdout  # sh read an ELF as a script and failed
    assert [q.path.endswith(b"/s") for q in gate.server.requests] == [True]  # nothing else ran


@pytest.mark.parametrize(
    "line",
    [
        "#!/bin/sh",
        "#! /bin/sh",
        "#!/bin/sh -e",
        "#!\t/bin/sh\t-e  ",
        "#!/usr/bin/env -S sh -e",
        "#!/bin/sh " + "-e" + " " * 300,  # longer than the kernel's 256-byte buffer
    ],
)
def test_the_server_reads_every_shebang_as_the_client_does(gate: Gate, line: str) -> None:
    """The client executes the interpreter as it parsed the #! line, the server judges its own
    reading of the same descriptor: both parsers are the kernel's, so they always agree."""
    script = gate.work / "odd"
    script.write_text(f"{line}\necho ran\n")
    script.chmod(0o755)
    r = gate.run(["/bin/sh", "-c", "./odd"])
    assert (r.returncode, r.stdout) == (0, b"ran\n"), r.stderr
    (req,) = [q for q in gate.server.requests if q.path.endswith(b"/odd")]
    assert req.refused == "" and req.interpreters, req
