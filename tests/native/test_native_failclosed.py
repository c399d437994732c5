"""Fail closed: no server, a broken server, no session, and a process trying to leave the gate
by editing its environment."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from execgate.gate import protocol as P

from .gateserver import Close, Raw
from .support import Gate


def test_unreachable_server(gate: Gate) -> None:
    env = dict(gate.env, EXECGATE_SOCKET=str(gate.work / "nobody.sock"))
    r = gate.run(["bash", "-c", "/bin/echo hi; echo rc=$?"], env=env)
    assert r.stdout == b"rc=126\n"
    assert r.stderr.startswith(
        b"execgate: denied: /bin/echo hi: execgate server unreachable ("
        + str(gate.work / "nobody.sock").encode()
        + b": No such file or directory)\n"
    )
    # a socket nobody accepts on
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(gate.work / "dead.sock"))
    s.close()
    env = dict(gate.env, EXECGATE_SOCKET=str(gate.work / "dead.sock"))
    r = gate.run(["bash", "-c", "/bin/echo hi; echo rc=$?"], env=env)
    assert r.stdout == b"rc=126\n" and b"Connection refused" in r.stderr


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Raw(b"garbage!"), b"malformed answer from the execgate server (too large)"),
        (Raw(P.encode("maybe")), b"malformed answer"),
        (Raw(P.encode("run", "extra")), b"malformed answer"),
        (Raw(P.encode("escalate")), b"malformed answer"),
        (Raw(P.encode("deny")), b"malformed answer"),
        (Raw(b"\x05\0\0\0EG2\0x"), b"malformed answer"),
        (Raw(b"\x00\0\0\0"), b"malformed answer from the execgate server (empty)"),
        (Raw(b"\x64\0\0\0EG1\0run\0"), b"in the middle of its answer"),
        (Close(), b"closed the connection without answering"),
    ],
)
def test_broken_answers_deny(gate: Gate, answer: object, reason: bytes) -> None:
    gate.server.rule = lambda req: answer  # type: ignore[assignment,return-value]
    r = gate.sh("/bin/echo should-not-run; echo rc=$?")
    assert r.stdout == b"rc=126\n"
    assert r.stderr.startswith(b"execgate: denied: /bin/echo should-not-run: ")
    assert reason in r.stderr, r.stderr


def test_no_session(gate: Gate) -> None:
    for change, why in [
        ({"EXECGATE_TOKEN": None}, b"EXECGATE_TOKEN is not set"),
        ({"EXECGATE_TOKEN": "ABC"}, b"EXECGATE_TOKEN is malformed"),
        ({"EXECGATE_TOKEN": "0" * 31 + "G"}, b"EXECGATE_TOKEN is malformed"),
        ({"EXECGATE_SOCKET": None}, b"EXECGATE_SOCKET is not set"),
        ({"EXECGATE_SOCKET": "relative.sock"}, b"EXECGATE_SOCKET is not an absolute"),
    ]:
        env = dict(gate.env)
        for k, v in change.items():
            if v is None:
                env.pop(k)
            else:
                env[k] = v
        r = gate.run(["bash", "-c", "/bin/echo x; echo rc=$?"], env=env)
        assert r.stdout == b"rc=126\n"
        assert r.stderr.startswith(b"execgate: denied: /bin/echo x: no execgate session: " + why)


def test_environment_reinjected(gate: Gate) -> None:
    r = gate.sh("env -i /usr/bin/env")
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines())
    for k in (
        "EXECGATE_SOCKET",
        "EXECGATE_TOKEN",
        "EXECGATE_WRAPPER",
        "EXEC_WRAPPER",
        "BASH_EXEC_WRAPPER",
        "LD_PRELOAD",
    ):
        assert env[k] == gate.env[k], k
    # edited, removed: all come back; the caller's other preloads are kept after ours
    other = gate.work / "other.so"
    other.write_bytes(b"")  # never loaded by a program here: only the string matters
    r = gate.sh(f"""
unset LD_PRELOAD EXEC_WRAPPER
export EXECGATE_SOCKET=/tmp/elsewhere.sock EXECGATE_TOKEN={"f" * 32} BASH_EXEC_WRAPPER=/bin/true
LD_PRELOAD={other} /usr/bin/env -u LD_PRELOAD /usr/bin/env
""")
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
    for k in (
        "EXECGATE_SOCKET",
        "EXECGATE_TOKEN",
        "EXECGATE_WRAPPER",
        "EXEC_WRAPPER",
        "BASH_EXEC_WRAPPER",
        "LD_PRELOAD",
    ):
        assert env[k] == gate.env[k], k
    r = gate.sh(f"LD_PRELOAD={other} /usr/bin/env")
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
    assert env["LD_PRELOAD"] == f"{gate.native['preload']} {other}"


def test_tampering_does_not_escape(gate: Gate) -> None:
    r = gate.sh(f"""
unset LD_PRELOAD; forbidden a; echo rc1=$?
env -i {gate.bin}/forbidden b; echo rc2=$?
env -u LD_PRELOAD -u EXECGATE_TOKEN /bin/sh -c 'forbidden c'; echo rc3=$?
EXECGATE_SOCKET=/nonexistent/x.sock forbidden d; echo rc4=$?
LD_PRELOAD= BASH_EXEC_WRAPPER= EXEC_WRAPPER= /bin/sh -c 'forbidden e'; echo rc5=$?
python3 -c 'import subprocess; subprocess.run(["{gate.bin}/forbidden", "f"], env={{}})'; echo rc6=$?
""")
    out = r.stdout.decode()
    for i in range(1, 6):
        assert f"rc{i}=126" in out, out
    assert "rc6=1" in out  # PermissionError
    assert not gate.forbidden_ran()
    # every one of them was decided by the real server (socket and token re-injected)
    denied = [q for q in gate.server.requests if q.path.endswith(b"/forbidden")]
    assert len(denied) >= 6


def test_long_command_is_truncated_in_denial(gate: Gate) -> None:
    gate.server.rule = lambda req: Close()
    r = gate.sh("/bin/echo " + "y" * 5000)
    line = r.stderr.decode().splitlines()[0]
    # the cut says how much it hides: 240 bytes shown ("/bin/echo " and 230 of the y's)
    assert line.startswith("execgate: denied: /bin/echo " + "y" * 230 + "… (4770 more bytes): ")
    assert len(line) < 400


def test_concurrent_execs(gate: Gate) -> None:
    """Many processes asking at once (xargs -P): each gets its own answer."""
    r = gate.sh(
        "seq 1 200 | xargs -P 16 -n 1 /bin/echo | sort -n | tail -1; "
        "seq 1 20 | xargs -P 8 -n 1 forbidden; echo rc=$?"
    )
    assert r.stdout.splitlines()[0] == b"200"
    assert not gate.forbidden_ran()
    assert sum(1 for q in gate.server.requests if q.path == b"/bin/echo") == 200
    _ = threading, os
