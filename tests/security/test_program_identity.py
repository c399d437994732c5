"""A gated process cannot get another file escalated than the one that was judged, nor run a
#! interpreter policy forbids through a link (issue 8, items 1, 5, 6, 9).

Every attack runs for real inside `execgate run` (sandbox off, workspace-write, with
--strict-exec), as root and as an unprivileged user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import give_to

MODES = {
    "off": ["--sandbox", "off"],
    "workspace-write": ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"],
    "strict-exec": [
        "--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir", "--strict-exec",
    ],
}  # fmt: skip

# Speaks EG1 with the session's own socket and token and forged names and descriptors.
FORGER = textwrap.dedent(
    """
    import os, socket, sys
    from execgate.gate import protocol as P
    marker, = sys.argv[1:]
    def ask(path, fds):
        req = P.ExecRequest(token=os.environb[b"EXECGATE_TOKEN"], via="execve", pid=os.getpid(),
            ppid=os.getppid(), cwd=os.getcwdb(), path=path, interpreters=(), argv=(b"ls",))
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.environ["EXECGATE_SOCKET"])
            socket.send_fds(s, [P.encode_exec_request(req)], fds)
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        return P.split_payload(answer[4:])[0].decode() if answer else "closed"
    evil = os.open(marker, os.O_PATH)
    elf = os.open(os.path.join(os.path.dirname(marker), "evil"), os.O_RDONLY)
    ls = os.open("/usr/bin/ls", os.O_RDONLY)
    d = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    print("nofd", ask(b"/usr/bin/ls", []))
    print("dirfd", ask(b"/usr/bin/ls", [d]))
    print("otherscript", ask(b"/usr/bin/ls", [evil]))
    print("otherfile", ask(b"/usr/bin/ls", [elf]))
    print("twofds", ask(b"/usr/bin/ls", [ls, ls]))
    print("realls", ask(b"/usr/bin/ls", [ls]))
    """
)


def _setup(base: Path, outside: Path) -> tuple[Path, Path, Path]:
    ws = base / "ws"
    ws.mkdir()
    marker = ws / "marker"
    marker.write_text(f"#!/bin/sh\ntouch {outside}/escaped 2>/dev/null; echo marker ran\n")
    marker.chmod(0o755)
    rules = base / "r.rules"
    rules.write_text(
        'prefix_rule(["ls"], "allow")\n'
        'prefix_rule(["forbidden"], "forbidden", justification="never")\n'
    )
    forbidden = base / "bin" / "forbidden"
    forbidden.parent.mkdir()
    forbidden.write_text(f"#!/bin/sh\ntouch {outside}/forbidden-ran\n")
    forbidden.chmod(0o755)
    return ws, rules, forbidden


def _run(user, ws: Path, rules: Path, mode: str, script: str, base: Path):  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *MODES[mode],
           "--", "bash", "-c", script]  # fmt: skip
    src = str(Path(__file__).resolve().parents[2] / "src")  # the forger imports the protocol
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": f"{base / 'bin'}:/usr/bin:/bin",
           "PYTHONPATH": src}  # fmt: skip
    if user is None:
        return subprocess.run(cmd, cwd=ws, env={**os.environ, **env}, capture_output=True,
                              timeout=120)  # fmt: skip
    return user.run(cmd, cwd=ws, env=env)


@pytest.mark.parametrize("mode", MODES)
def test_forged_requests_and_look_alike_names_are_never_escalated(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    outside = base / "outside"
    outside.mkdir()
    ws, rules, _ = _setup(base, outside)
    (ws / "forge.py").write_text(FORGER)
    shutil.copy2("/usr/bin/touch", ws / "evil")  # an ELF that is not ls
    give_to(base, user)
    # a copy, a symlink and a hard link named like the allowed program
    script = (
        f"python3 forge.py {ws / 'marker'}; "
        "cp marker ./ls; ./ls; echo copy=$?; "
        "mkdir -p l; ln -s ../marker l/ls; ./l/ls; echo link=$?; echo alive"
    )
    r = _run(user, ws, rules, mode, script, base)
    out = r.stdout.decode()
    assert "alive" in out, (out, r.stderr)
    for forged in ("nofd", "dirfd", "otherscript", "twofds"):
        assert f"{forged} deny" in out, (out, r.stderr)
    assert "otherfile run" in out, out  # another file than PATH names: at most runs in place
    # the control: the real ls is escalated where escalation means leaving a sandbox
    assert f"realls {'run' if mode == 'off' else 'escalate'}" in out, out
    if mode != "strict-exec":  # (strict-exec refuses to exec from the workspace at all)
        assert out.count("marker ran") == 2, out  # the look-alikes ran, in place
    if mode != "off":  # sandbox off: everything runs unconfined in place anyway
        assert not (outside / "escaped").exists(), out  # nothing left the sandbox


@pytest.mark.parametrize("mode", MODES)
def test_interpreters_through_links_are_judged_as_the_program(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    outside = base / "outside"
    outside.mkdir()
    ws, rules, forbidden = _setup(base, outside)
    os.link(forbidden, ws / "hard")  # a hard link under another name
    give_to(base, user)
    script = (
        f"ln -s {forbidden} lnk; "
        f"printf '#!{ws}/lnk\\n' > a; printf '#!lnk\\n' > b; printf '#!{ws}/a\\n' > c; "
        f"printf '#!{ws}/hard\\n' > d; "
        "chmod +x a b c d; ./a; echo a=$?; ./b; echo b=$?; ./c; echo c=$?; ./d; echo d=$?; "
        "echo alive"
    )
    r = _run(user, ws, rules, mode, script, base)
    out = r.stdout.decode()
    assert "alive" in out, (out, r.stderr)
    assert not (outside / "forbidden-ran").exists(), (out, r.stderr)
    for name in "abcd":
        assert f"{name}=126" in out, out  # each tried, each denied
    assert r.stderr.count(b"execgate: denied:") >= 4, r.stderr
