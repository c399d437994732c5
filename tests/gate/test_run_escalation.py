"""Escalation: an `allow`ed program runs outside the sandbox, on the caller's descriptors, and
its exit status comes back exactly. Sessions leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import EXECGATE, Gate

WS = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]


def test_escalated_program_writes_where_the_sandbox_forbids(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["touch"], "allow")\n')
    outside = gate.root.parent / "home" / "outside"
    script = f"echo no > {outside}; echo rc1=$?; touch {outside}; echo rc2=$?"
    result = gate.run(script, options=WS)
    assert b"rc1=1" in result.stdout, result.stderr
    assert b"rc2=0" in result.stdout, result.stderr
    assert outside.exists()
    assert outside.read_bytes() == b""  # created by touch, not by the sandboxed echo


def test_escalated_program_uses_the_callers_stdio_and_descriptors(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["cat"], "allow")\nprefix_rule(["sh"], "allow")\n')
    result = gate.run(
        "printf 'piped in' | cat; echo; cat /nonexistent-file; echo rc=$?;"
        " sh -c 'echo to-fd3 >&3' 3>fd3.txt; cat fd3.txt",
        options=WS,
        cwd=gate.root,
    )
    assert result.stdout.splitlines() == [b"piped in", b"rc=1", b"to-fd3"]
    assert b"cat: /nonexistent-file: No such file or directory" in result.stderr
    # stdin of the session itself reaches an escalated program too
    result = gate.run(["cat"], options=WS, input=b"from the terminal side")
    assert result.stdout == b"from the terminal side"


def test_escalated_exit_status_and_signal_death_come_back(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["sh"], "allow")\n')
    result = gate.run("sh -c 'exit 42'; echo rc=$?; sh -c 'kill -TERM $$'; echo rc=$?", options=WS)
    assert result.stdout == b"rc=42\nrc=143\n"


def test_escalated_program_stays_gated(gate: Gate) -> None:
    """A program `allow` lets out of the sandbox still cannot start a forbidden one."""
    gate.write_rules(
        'prefix_rule(["sh"], "allow")\n'
        'prefix_rule(["marker"], "forbidden", justification="marker must not run")\n'
    )
    result = gate.run("sh -c 'marker; echo inner=$?'", options=WS)
    assert b"inner=126" in result.stdout
    assert not gate.ran()


def test_escalated_program_environment(gate: Gate) -> None:
    """The caller's variables reach the escalated program; loader variables it added do not."""
    gate.write_rules('prefix_rule(["env"], "allow")\n')
    result = gate.run("export FOO=bar; LD_LIBRARY_PATH=/evil LD_AUDIT=/evil.so env", options=WS)
    lines = result.stdout.decode().splitlines()
    assert "FOO=bar" in lines
    assert not any(line.startswith(("LD_LIBRARY_PATH=", "LD_AUDIT=")) for line in lines)
    preload = [line for line in lines if line.startswith("LD_PRELOAD=")]
    assert len(preload) == 1 and "libexecgate.so" in preload[0]  # still gated


def _start(gate: Gate, script: str, options: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EXECGATE, "run", "--rules", str(gate.rules), *options, "--", "bash", "-c", script],
        env=gate.env,
        cwd=gate.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_for_line(proc: subprocess.Popen[bytes], expected: bytes) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == expected:
            return
    raise AssertionError(f"never printed {expected!r}; stderr: {proc.stderr.read()!r}")  # type: ignore[union-attr]


@pytest.mark.parametrize("target", ["execgate only", "whole process group"])
def test_sigterm_ends_the_session_and_kills_everything(gate: Gate, target: str) -> None:
    """Background jobs, a daemonised grandchild, and an escalated program all die with it."""
    gate.write_rules('prefix_rule(["perl"], "allow")\n')
    tag = gate.tag
    script = (
        f"perl -e '$0=\"{tag}-escalated\"; sleep 1000' & "
        f"(setsid bash -c 'exec -a {tag}-daemon sleep 1000' &) ; "
        f"bash -c 'exec -a {tag}-child sleep 1000' & "
        # all three exist before we say so
        f"until [ $(pgrep -c -f '^{tag}-') = 3 ]; do :; done; echo ready; wait"
    )
    proc = _start(gate, script, WS)
    _wait_for_line(proc, b"ready")
    assert len(gate.leftovers()) == 3
    if target == "execgate only":
        os.kill(proc.pid, signal.SIGTERM)  # like `timeout`
    else:
        os.killpg(proc.pid, signal.SIGTERM)  # like a closed terminal
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert gate.leftovers() == []


def test_when_the_command_ends_its_leftovers_are_killed(gate: Gate) -> None:
    tag = gate.tag
    result = gate.run(f"(exec -a {tag}-orphan sleep 1000 &) ; echo done")
    assert result.stdout == b"done\n"
    assert gate.leftovers() == []


def test_escalated_program_gets_no_stray_descriptors(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["dash"], "allow")\n')
    result = gate.run("dash -c 'ls /proc/$$/fd'", options=WS)
    assert result.stdout.split() == [b"0", b"1", b"2"], result.stderr


WHO_CLAIMS = r"""#!/usr/bin/python3
# An escalated program that tells who claimed it: its claimer waits in its process group,
# either the process that exec'ed (in-process claim) or execgate-wrapper (claim mode).
import os, sys
comms = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        continue
    after = stat[stat.rindex(")") + 2 :].split()
    if int(after[2]) == os.getpgrp() and int(pid) != os.getpid():
        comms.append(stat[stat.index("(") + 1 : stat.rindex(")")])
print(sys.argv[1], "wrapper" if "execgate-wrappe" in comms else "in-process", flush=True)
sys.exit(int(sys.argv[2]))
"""


def test_fork_and_vfork_children_both_escalate(gate: Gate) -> None:
    """bash forks and its child execs: the child claims in-process. Python's subprocess
    (vfork, or clone with CLONE_VFORK) and posix_spawn callers exec execgate-wrapper to claim.
    Either way: the program's output, its exit status, outside the sandbox."""
    who = gate.bin / "whoclaims"
    who.write_text(WHO_CLAIMS)
    who.chmod(0o755)
    gate.write_rules(
        f'host_executable(name="whoclaims", paths=["{who}"])\nprefix_rule(["whoclaims"], "allow")\n'
    )
    script = (
        "whoclaims bash 3; echo rc=$?; "
        "python3 -c 'import subprocess, sys; "
        'sys.exit(subprocess.run(["whoclaims", "python", "4"]).returncode)\'; echo rc=$?'
    )
    result = gate.run(script, options=WS)
    assert result.stdout == b"bash in-process\nrc=3\npython wrapper\nrc=4\n", result.stderr


def test_escalated_program_reaches_the_network_the_sandbox_blocks(gate: Gate) -> None:
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.sendall(b"hello over tcp\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    client = (
        "import socket, sys\n"
        "try:\n"
        f"    print(socket.create_connection(('127.0.0.1', {port})).recv(100).decode(), end='')\n"
        "except OSError as e:\n"
        "    print('refused:', e.strerror)\n"
    )
    confined = gate.run(["/usr/bin/python3", "-c", client], options=WS)  # no rule: sandboxed
    assert confined.stdout.startswith(b"refused:"), confined.stderr
    gate.write_rules('prefix_rule(["python3"], "allow")\n')
    escalated = gate.run(["bash", "-c", 'python3 -c "$0"', client], options=WS)
    assert escalated.stdout == b"hello over tcp\n", escalated.stderr
    listener.close()


def test_gate_escalated_false_lets_escalated_programs_leave_the_gate(gate: Gate) -> None:
    """The Codex behaviour, on request: what an escalated program starts is not gated."""
    (Path(gate.env["EXECGATE_HOME"]) / "config.toml").write_text("gate_escalated = false\n")
    gate.write_rules(
        'prefix_rule(["sh"], "allow")\n'
        'prefix_rule(["marker"], "forbidden", justification="marker must not run")\n'
    )
    result = gate.run("sh -c 'marker; echo inner=$?; echo preload=$LD_PRELOAD'", options=WS)
    assert b"inner=0" in result.stdout
    assert b"preload=\n" in result.stdout
    assert gate.ran()


def test_each_escalation_is_logged(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["sh"], "allow")\n')
    gate.run("sh -c true; sh -c 'exit 0' x", options=WS)
    log = (Path(gate.env["EXECGATE_HOME"]) / "log" / "escalations.log").read_text()
    lines = log.splitlines()
    assert len(lines) == 2
    sh = os.path.realpath("/usr/bin/sh")
    assert f"escalated sh -c true (program {sh}," in lines[0]
    assert "sandbox workspace-write" in lines[0]


def test_a_loop_of_escalations_logs_every_one_in_order(gate: Gate) -> None:
    """The escalations log is written in batches after the answers: none is lost, each line
    names its own asking process and carries the time of its decision (in order)."""
    gate.write_rules('prefix_rule(["sh"], "allow")\n')
    result = gate.run("for i in $(seq 40); do sh -c 'echo $0' $i; done", options=WS)
    assert result.stdout.decode().split() == [str(i) for i in range(1, 41)]
    log = (Path(gate.env["EXECGATE_HOME"]) / "log" / "escalations.log").read_text()
    lines = log.splitlines()
    assert [line.split(" (program ")[0].rsplit(" ", 1)[1] for line in lines] == [
        str(i) for i in range(1, 41)
    ]
    assert len({line.split(", pid ")[1].split(",")[0] for line in lines}) == 40
    stamps = [line[:23] for line in lines]
    assert stamps == sorted(stamps)


def test_repeated_escalations_each_run_their_own_command(gate: Gate) -> None:
    """The authorization of a command escalated again is reused (built once per command
    shape): each exec still gets exactly its own argv and working directory, never the one
    kept from an exec before it, and a script is authorized anew every time."""
    gate.write_rules('prefix_rule(["sh"], "allow")\n')
    for name in ("a", "b"):
        (gate.root / name).mkdir()
    script = gate.root / "show"
    script.write_text("#!/bin/sh\necho script:$1:$(pwd)\n")
    script.chmod(0o755)
    result = gate.run(
        "for d in a b a b; do for w in x y x; do (cd $d && sh -c 'echo $0:$(pwd)' $w); done; done;"
        f" (cd a && {script} 1); (cd b && {script} 2)",
        options=WS,
        cwd=gate.root,
    )
    expected = [f"{w}:{gate.root / d}" for d in "abab" for w in "xyx"]
    expected += [f"script:1:{gate.root / 'a'}", f"script:2:{gate.root / 'b'}"]
    assert result.stdout.decode().splitlines() == expected, result.stderr
    log = (Path(gate.env["EXECGATE_HOME"]) / "log" / "escalations.log").read_text()
    assert log.count("escalated sh -c") == 12
