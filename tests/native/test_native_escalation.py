"""Escalation (protocol §4) through the real wrapper, and the wrapper's patched-shell mode (§5).

The stand-in server really spawns the escalated program on the descriptors, environment and cwd
the wrapper sent, so these are end-to-end checks of what the caller sees."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import textwrap

import pytest

from .gateserver import Deny, Escalate, Run, deny_names
from .support import Gate, marker


def esc_rule(gate: Gate) -> None:
    gate.server.rule = deny_names("forbidden", escalate=("esc",))


def test_escalated_program_gets_stdio_fd3_and_status(gate: Gate) -> None:
    esc_rule(gate)
    marker(gate.bin, "esc", 'read x; echo "out:$x:$*"; echo err >&2; echo three >&3; exit 7')
    r = gate.run(["bash", "-c", "printf 'input\\n' | esc a 'b c' 3>fd3.txt; echo rc=$?"])
    assert r.stdout == b"out:input:a b c\nrc=7\n"
    assert r.stderr == b"err\n"
    assert (gate.work / "fd3.txt").read_text() == "three\n"
    (e,) = gate.server.escalations
    assert e.claim is not None and e.claim.fd_numbers == (0, 1, 2, 3)
    env = dict(x.split(b"=", 1) for x in e.claim.env)
    assert env[b"EXECGATE_TOKEN"] == gate.server.token.encode()
    assert env[b"LD_PRELOAD"].startswith(str(gate.native["preload"]).encode())
    assert e.request.argv == (b"esc", b"a", b"b c")


@pytest.mark.parametrize("passed", [9, 300, 700])
def test_the_claim_passes_exactly_the_inheritable_descriptors(gate: Gate, passed: int) -> None:
    """Whatever the size of the claimer's descriptor table (64, 512, above what the claim probes
    without /proc): every inheritable descriptor and no close-on-exec one."""
    esc_rule(gate)
    marker(gate.bin, "esc", "exit 0")
    code = textwrap.dedent(
        f"""
        import os
        fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(fd, {passed})
        os.dup2(fd, {passed} + 5, inheritable=False)
        os.dup2(fd, 60, inheritable=False)
        os.close(fd)
        os.execvp("esc", ["esc"])
        """
    )
    r = gate.run(["python3", "-c", code])
    assert r.returncode == 0, r.stderr
    (e,) = gate.server.escalations
    assert e.claim is not None and e.claim.fd_numbers == (0, 1, 2, passed)


def test_a_claim_passes_the_lowest_descriptors_it_can_and_says_how_many_stay_behind(
    gate: Gate,
) -> None:
    """More inheritable descriptors than a claim carries (253, docs/protocol.md §4): the lowest
    ones go, ascending, and one line says how many stayed behind."""
    esc_rule(gate)
    marker(gate.bin, "esc", "exit 0")
    code = textwrap.dedent(
        """
        import os
        fd = os.open("/dev/null", os.O_RDONLY)
        for n in range(3, 263):
            os.dup2(fd, n)  # (dup2 to itself keeps close-on-exec)
        os.set_inheritable(fd, True)
        os.execvp("esc", ["esc"])
        """
    )
    r = gate.run(["python3", "-c", code])
    assert r.returncode == 0, r.stderr
    (e,) = gate.server.escalations
    assert e.claim is not None
    passed = e.claim.fd_numbers
    stdio = [n for n in passed if n < 3]  # (whichever of 0-2 the harness left open)
    assert passed == (*stdio, *range(3, 256 - len(stdio)))
    line = f"{len(stdio) + 260 - 253} inherited descriptors above fd {passed[-1]} not passed"
    assert line.encode() in r.stderr, r.stderr


def test_escalated_program_stays_gated(gate: Gate) -> None:
    esc_rule(gate)
    marker(gate.bin, "esc", "forbidden inside; echo inner-rc=$?")
    r = gate.sh("esc")
    assert r.stdout == b"inner-rc=126\n" and not gate.forbidden_ran()


def test_signal_death_is_relayed(gate: Gate) -> None:
    esc_rule(gate)
    marker(gate.bin, "esc", 'kill -"$1" $$')
    r = gate.sh("esc TERM; echo rc=$?; esc KILL; echo rc=$?; esc SEGV; echo rc=$?")
    assert r.stdout == b"rc=143\nrc=137\nrc=139\n"
    assert b"core dumped" not in r.stderr


def test_signals_are_forwarded(gate: Gate) -> None:
    esc_rule(gate)
    waiter = (
        "import signal, sys\n"
        "def h(s, f):\n    print('got', s, flush=True); sys.exit(9)\n"
        "signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGUSR1, h)\n"
        "print('ready', flush=True)\n"
        "while True: signal.pause()\n"
    )
    marker(gate.bin, "esc", f'exec python3 -c "{waiter}"')
    p = subprocess.Popen(
        ["bash", "-c", "exec esc"], env=gate.env, cwd=gate.work, stdout=subprocess.PIPE
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"  # the escalated program runs, handler installed
    os.kill(p.pid, signal.SIGUSR1)  # p is the claimer: bash, which claimed in-process
    out, _ = p.communicate(timeout=60)
    assert out == f"got {int(signal.SIGUSR1)}\n".encode()
    assert p.returncode == 9
    (e,) = gate.server.escalations
    assert e.signals == [signal.SIGUSR1]
    assert e.claimer_pid == p.pid


def _claimers(gate: Gate) -> list[str | None]:
    with gate.server.lock:
        return [e.claimer_exe for e in gate.server.escalations]


def test_who_claims_fork_children_in_process_vfork_children_through_the_wrapper(
    gate: Gate,
    cprog,  # type: ignore[no-untyped-def]
) -> None:
    """A process that may turn into the claim does (no extra exec); a vfork child (its parent
    waits for an exec), posix_spawn, and a process with other threads (an exec would end
    them) exec the wrapper. Every way ends with the program's output and status."""
    esc_rule(gate)
    marker(gate.bin, "esc", 'cat >/dev/null; echo "esc:$*"; exit 6')
    claimers = str(cprog("claimers"))
    wrapper = str(gate.native["wrapper"])
    cases = {"fork": claimers, "vfork": wrapper, "thread": wrapper, "from-thread": wrapper}
    for filtered in ([], ["no-unshare"]):  # unshare(CLONE_VM) tells, or else kcmp and /proc
        for how, claimer in cases.items():
            before = len(_claimers(gate))
            r = gate.run([claimers, *filtered, how, "esc", how], input=b"")
            assert (r.returncode, r.stdout) == (6, f"esc:{how}\n".encode()), (how, r)
            assert _claimers(gate)[before:] == [claimer], (filtered, how)
    before = len(_claimers(gate))
    r = gate.sh("esc bash </dev/null; echo rc=$?")  # bash forks, the child execs
    assert r.stdout == b"esc:bash\nrc=6\n"
    code = "import subprocess; print(subprocess.run(['esc', 'py'], input=b'').returncode)"
    r = gate.run(["python3", "-c", code])  # subprocess: vfork (or clone(CLONE_VFORK)), exec
    assert r.stdout == b"esc:py\n6\n"
    bash = os.path.realpath(shutil.which("bash", path=gate.env["PATH"]) or "")
    assert _claimers(gate)[before:] == [bash, wrapper]


def _readline(p: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
    """A line of p's unbuffered stdout (bufsize=0: nothing read ahead that select misses)."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)  # a guard against a hang only
    assert ready, "no output"
    return p.stdout.readline()


def test_in_process_claim_closes_what_an_exec_would_close(gate: Gate) -> None:
    """The claimer's close-on-exec descriptors close once the claim is sent, as an exec would
    close them: here a pipe whose reader waits for end-of-file while the program runs."""
    esc_rule(gate)
    marker(gate.bin, "esc", "echo esc-running; read x; exit 3")
    code = textwrap.dedent(
        """
        import os
        r, w = os.pipe()  # close-on-exec, as Python makes them
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.execvp("esc", ["esc"])
        os.close(w)
        print("eof" if os.read(r, 1) == b"" else "data", flush=True)
        print("status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
        """
    )
    p = subprocess.Popen(
        ["python3", "-c", code],
        env=gate.env,
        cwd=gate.work,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    assert p.stdin is not None
    first = {_readline(p), _readline(p)}  # while esc still waits for its input
    assert first == {b"esc-running\n", b"eof\n"}
    p.stdin.close()
    assert _readline(p) == b"status 3\n"
    assert p.wait(60) == 0
    (e,) = gate.server.escalations
    assert e.claimer_exe == os.path.realpath(shutil.which("python3", path=gate.env["PATH"]) or "")


def test_in_process_claim_runs_no_handler_of_the_caller(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    """After an exec a caught signal has its default action again; so in a process that became
    the claim: SIGRTMIN (not forwarded) kills the claimer, and the escalated program, whose
    claimer is gone, is killed too."""
    esc_rule(gate)
    marker(gate.bin, "esc", "echo started; exec sleep 1000")
    p = subprocess.Popen(
        [str(cprog("claimers")), "handler", "esc"],
        env=gate.env,
        cwd=gate.work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    assert _readline(p) == b"started\n"
    e = gate.server.wait_escalation_started()
    assert e.claimer_pid == p.pid  # claimed in-process
    os.kill(p.pid, signal.SIGRTMIN)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGRTMIN
    assert out == b""  # no "handler ran"; and the pipe's last writer, the program, is gone
    assert e.ended.wait(60)
    assert e.status is not None and os.WTERMSIG(e.status) == signal.SIGKILL


def test_escalation_from_every_spawner(gate: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    esc_rule(gate)
    marker(gate.bin, "esc", 'cat >/dev/null; echo "esc:$*"; exit 4')
    entry = cprog("entry")
    for via in ("execve", "execvp", "posix_spawn", "posix_spawnp", "fexecve"):
        prog = "esc" if via.endswith("p") else str(gate.bin / "esc")
        r = gate.run([entry, via, prog, via], input=b"")
        assert (r.returncode, r.stdout) == (4, f"esc:{via}\n".encode()), (via, r)
    r = gate.run([entry, "system", "esc sys"], input=b"")
    assert r.stdout == b"esc:sys\nstatus=1024\n"
    r = gate.run([entry, "popen-r", "esc po </dev/null"])
    assert r.stdout == b"esc:po\nstatus=1024\n"
    code = (
        "import subprocess; r = subprocess.run(['esc', 'py'], input=b'data', "
        "capture_output=True); print(r.returncode, r.stdout)"
    )
    r = gate.run(["python3", "-c", code])
    assert r.stdout == b"4 b'esc:py\\n'\n"


def test_escalation_without_wrapper_is_denied(gate: Gate) -> None:
    esc_rule(gate)
    marker(gate.bin, "esc", "echo ran")
    env = {k: v for k, v in gate.env.items() if k != "EXECGATE_WRAPPER"}
    r = gate.run(["bash", "-c", "esc; echo rc=$?"], env=env)
    assert r.stdout == b"rc=126\n"
    assert b"escalation needs EXECGATE_WRAPPER" in r.stderr


def test_claims_go_to_the_claim_socket(gate: Gate) -> None:
    """claim.sock beside EXECGATE_SOCKET: a stand-in without one makes the claim fail closed."""
    esc_rule(gate)
    marker(gate.bin, "esc", "echo ran")
    gate.server.claim_path.unlink()
    r = gate.sh("esc; echo rc=$?")
    assert r.stdout == b"rc=126\n"
    assert r.stderr.startswith(b"execgate: denied: esc: execgate server unreachable")


def test_claim_with_unknown_ticket(gate: Gate) -> None:
    r = subprocess.run(
        ["execgate-claim", "bogus"],
        executable=gate.native["wrapper"],
        env=gate.env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 126
    assert r.stderr == b"execgate: denied: unknown ticket\n"


def test_claim_server_gone(gate: Gate) -> None:
    env = dict(gate.env, EXECGATE_SOCKET=str(gate.work / "none.sock"))
    r = subprocess.run(
        ["execgate-claim", "t1"],
        executable=gate.native["wrapper"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 126
    assert r.stderr.startswith(
        b"execgate: denied: escalated program (ticket t1): execgate server unreachable"
    )


def test_wrapper_usage(gate: Gate) -> None:
    r = subprocess.run([gate.native["wrapper"]], env=gate.env, capture_output=True)
    assert r.returncode == 2
    assert r.stderr == b"usage: execgate-wrapper FILE [ARGV]...\n"


def test_wrapper_patched_shell_convention(gate: Gate) -> None:
    w = str(gate.native["wrapper"])
    r = gate.run([w, "/bin/echo", "echo", "hi", ""])
    assert (r.returncode, r.stdout) == (0, b"hi \n")
    (q,) = gate.server.requests  # asked once: the preloaded interposer did not ask again
    assert (q.via, q.path, q.argv) == ("wrapper", b"/bin/echo", (b"echo", b"hi", b""))
    r = gate.run([w, "./bin/allowed", "allowed", "rel"])
    assert r.stdout == b"allowed:rel\n"
    assert gate.server.requests[-1].path == str(gate.work).encode() + b"/./bin/allowed"
    r = gate.run([w, str(gate.bin / "forbidden"), "forbidden"])
    assert r.returncode == 126 and b"forbidden by test rule" in r.stderr
    r = gate.run([w, str(gate.work / "nope"), "nope"])
    assert r.returncode == 127 and r.stderr.endswith(b"No such file or directory\n")
    esc_rule(gate)
    marker(gate.bin, "esc", 'echo "esc:$*"; exit 5')
    r = gate.run([w, str(gate.bin / "esc"), "esc", "in-process"])
    assert (r.returncode, r.stdout) == (5, b"esc:in-process\n")
    env = dict(gate.env, EXECGATE_SOCKET=str(gate.work / "none.sock"))
    r = gate.run([w, "/bin/echo", "echo"], env=env)
    assert r.returncode == 126 and b"execgate server unreachable" in r.stderr
    assert not gate.forbidden_ran()


def test_exec_of_the_wrapper_is_not_gated_twice(gate: Gate) -> None:
    r = gate.sh('"$EXEC_WRAPPER" /bin/echo echo via-wrapper')
    assert r.stdout == b"via-wrapper\n"
    assert [q.via for q in gate.server.requests] == ["wrapper"]
    _ = Deny, Escalate, Run
