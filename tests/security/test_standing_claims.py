"""Standing authorizations (docs/protocol.md §4 "Standing claims", §7 `standing`): once the
server has escalated an exec whose kept action follows from its facts alone, the launcher takes
claims of exactly that exec without asking it. Every attack here is made from inside a real
`execgate run --sandbox workspace-write` session, as root and as an unprivileged user: forged
standing claims that differ from what was judged in one fact (token, one byte of argv, PATH,
working directory, a racing thread's chdir, another file, a script), the judged file rewritten
in place by an escalated program, a rules edit racing a loop of claims, and a flood of claims
and authorizations. The escalations log says which escalations were standing claims.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .conftest import give_to

MODE = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]
CLAIMER = Path(__file__).with_name("standing_claim.py")


def run_session(
    user: Any,
    base: Path,
    rules: str,
    script: str,
    options: tuple[str, ...] = (),
    own: dict[str, str] | None = None,
) -> tuple[str, str, list[str]]:
    """Run ``bash -c script`` in a session with ``rules`` from ``base/ws``; (stdout, stderr,
    the escalations log's lines). ``own``: added to the session's own environment (the
    user's)."""
    (base / "r.rules").write_text(rules)
    give_to(base, user)
    time.sleep(1.05)  # the files made for the test are a second old: standing may be offered
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(base / "r.rules"), *MODE,
           *options, "--", "bash", "-c", script]  # fmt: skip
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": path, "LANG": "C.UTF-8", **(own or {})}
    if user is None:
        r = subprocess.run(cmd, cwd=base / "ws", env={**os.environ, **env}, capture_output=True,
                           timeout=180)  # fmt: skip
    else:
        r = user.run(cmd, cwd=base / "ws", env=env, timeout=180)
    log = base / "home" / "log" / "escalations.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return r.stdout.decode(), r.stderr.decode(), lines


def folders(base: Path) -> tuple[Path, Path]:
    ws, out = base / "ws", base / "outside"  # out: read-only inside the sandbox
    ws.mkdir()
    out.mkdir()
    return ws, out


def escalations(lines: list[str], command: str) -> list[bool]:
    """For each escalation of ``command`` in the log, in order: was it a standing claim?"""
    return [line.endswith(", standing)") for line in lines if f"escalated {command} (" in line]


def forged(*specs: dict[str, Any]) -> str:
    return " ".join(["python3", str(CLAIMER), *(f"'{json.dumps(s)}'" for s in specs)])


def test_a_standing_claim_must_match_every_judged_fact(place: tuple[Any, Path]) -> None:
    user, base = place
    ws, out = folders(base)
    shutil.copy2("/usr/bin/touch", ws / "copy")  # another file with the same content
    shutil.copy2("/usr/bin/touch", out / "tool")  # a program only escalations can write
    (out / "s.sh").write_text("#!/bin/sh\necho script ran\n")
    (out / "s.sh").chmod(0o755)
    for name in ("a", "rel", "t"):  # made now: a file made in a watched folder revokes all
        (out / name).touch()
    rules = f"""\
prefix_rule(["touch"], "allow")
prefix_rule(["cp"], "allow")
host_executable(name = "tool", paths = ["{out}/tool"])
prefix_rule(["tool"], "allow")
host_executable(name = "s.sh", paths = ["{out}/s.sh"])
prefix_rule(["s.sh"], "allow")
"""
    a = f"{out}/a"
    exact = {"argv": ["touch", a], "program": "/usr/bin/touch"}
    attacks = [
        {"name": "exact", **exact},  # the very exec that was judged: taken
        {"name": "token", **exact, "token": "0" * 32},
        {"name": "argv", "argv": ["touch", f"{out}/b"], "program": "/usr/bin/touch"},
        {"name": "argv0", "argv": ["touch ", a], "program": "/usr/bin/touch"},
        {"name": "unseen", "argv": ["touch", a, f"{out}/c"], "program": "/usr/bin/touch"},
        {"name": "path", **exact, "path": "/bin/touch"},
        {"name": "cwd", **exact, "cwd": "/"},
        {"name": "file", **exact, "path": "/usr/bin/touch", "program": str(ws / "copy")},
        {"name": "shebang", "argv": [f"{out}/s.sh"], "program": f"{out}/s.sh"},
        {"name": "race", "argv": ["touch", "rel"], "program": "/usr/bin/touch",
         "cwd": str(out), "race": 25, "race_cwd": str(ws)},
    ]  # fmt: skip
    script = f"""
touch {a}; touch {a}; touch {a}
cd {out} && touch rel && touch rel; cd {ws}
{out}/s.sh; {out}/s.sh
{forged(*attacks)}
{out}/tool {out}/t; {out}/tool {out}/t; {out}/tool {out}/t
cp /usr/bin/true {out}/tool
{out}/tool {out}/t; {out}/tool {out}/t
ls {out}; ls {ws}; echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    answers: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        name, _, answer = line.partition(" ")
        answers.setdefault(name, []).append(answer)
    assert answers["exact"] == ["go exit 0"], (stdout, stderr)
    for name in ("token", "argv", "argv0", "unseen", "path", "cwd", "file", "shebang"):
        assert answers[name] == ["miss"], (name, stdout, stderr)
    assert not (out / "b").exists() and not (out / "c").exists()
    # A racing chdir never moves the program: whatever was taken ran where it was judged.
    assert set(answers["race"]) <= {"go exit 0", "miss"}, stdout
    assert len(answers["race"]) == 25
    assert (out / "rel").exists() and not (ws / "rel").exists()
    # Repeats were standing claims, each logged; a script never is.
    assert escalations(log, f"touch {a}") == [False, True, True, True], log
    assert escalations(log, f"{out}/s.sh") == [False, False], log
    # The judged file rewritten in place (same inode, by an escalated cp): judged again.
    assert escalations(log, f"{out}/tool {out}/t") == [False, True, True, False, False], log


def test_a_folder_swapped_for_a_symlink_above_the_program_is_no_standing_claim(
    place: tuple[Any, Path],
) -> None:
    """The folder watch sees the program's own folder only: a folder above it replaced by a
    symlink to itself, moved (the program's file, links and times unchanged), is seen by the
    claim's own look at the path, which must reach the file through no symlink."""
    user, base = place
    _, out = folders(base)
    (out / "a" / "b").mkdir(parents=True)
    shutil.copy2("/usr/bin/true", out / "a" / "b" / "tool")
    rules = f"""\
host_executable(name = "tool", paths = ["{out}/a/b/tool"])
prefix_rule(["tool"], "allow")
prefix_rule(["mv"], "allow")
prefix_rule(["ln"], "allow")
"""
    tool = f"{out}/a/b/tool"
    script = f"""
{tool}; {tool}; {tool}
mv {out}/a {out}/a2 && ln -s a2 {out}/a && echo swapped
{tool}; {tool}; echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "swapped" in stdout and "alive" in stdout, (stdout, stderr)
    assert (out / "a").is_symlink()
    standing = escalations(log, tool)
    assert standing[:3] == [False, True, True], log
    assert True not in standing[3:], log  # a miss: the server judged them again


def test_a_rules_edit_revokes_standing_claims_racing_it(place: tuple[Any, Path]) -> None:
    user, base = place
    ws, out = folders(base)
    (out / "r").touch()
    forbid = ws / "forbid.rules"
    forbid.write_text('prefix_rule(["touch"], "forbidden")\nprefix_rule(["cp"], "allow")\n')
    rules = 'prefix_rule(["touch"], "allow")\nprefix_rule(["cp"], "allow")\n'
    # A loop of claims while an escalated cp rewrites the rules: once the server has denied
    # one (it decided under the new rules), no standing claim may be taken any more.
    loop = f"touch {out}/r; echo s=$?; "
    script = (
        loop * 5
        + f"cp {forbid} {base}/r.rules; "
        + f"for i in $(seq 1 250); do {loop} sleep 0.01; done; echo alive"
    )
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    statuses = [line[2:] for line in stdout.splitlines() if line.startswith("s=")]
    assert statuses[:5] == ["0"] * 5, (stdout, stderr)
    assert statuses[-1] != "0", (stdout, stderr)  # the edit took effect
    first_denial = next(i for i, s in enumerate(statuses) if s != "0")
    assert "0" not in statuses[first_denial:], statuses
    assert escalations(log, f"touch {out}/r")[:5] == [False, True, True, True, True], log
    assert len(escalations(log, f"touch {out}/r")) == first_denial, log


def test_standing_claims_and_authorizations_are_bounded(place: tuple[Any, Path]) -> None:
    user, base = place
    _, out = folders(base)
    rules = 'prefix_rule(["touch"], "allow")\n'
    flood = [{"name": "flood", "argv": ["touch", f"{out}/x{i}"], "program": "/usr/bin/touch"}
             for i in range(300)]  # fmt: skip
    # 80 commands, each escalated twice (the second a standing claim): more than the
    # launcher keeps (64), so the first one's authorization is gone when it comes again.
    script = (
        f"for i in $(seq 1 80); do touch {out}/f$i; touch {out}/f$i; done; "
        + forged(*flood)
        + f" | sort | uniq -c; touch {out}/f1; touch {out}/f80; echo alive"
    )
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert "300 flood miss" in stdout, (stdout, stderr)
    assert not any((out / f"x{i}").exists() for i in range(300))
    assert escalations(log, f"touch {out}/f1") == [False, True, False], log
    assert escalations(log, f"touch {out}/f80") == [False, True, True], log
    assert len([line for line in log if "escalated touch" in line]) == 162, log


def test_an_interpreter_is_never_standing_a_skill_script_still_asks(
    place: tuple[Any, Path],
) -> None:
    user, base = place
    ws, _ = folders(base)
    scripts = base / "home" / "skills" / "demo" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "tool.sh").write_text("echo skill ran\n")
    (ws / "tool.sh").write_text("echo plain ran\n")
    # `sh tool.sh` is escalated twice; then tool.sh becomes a link to a skill script (nothing
    # watches the workspace): the server looks for skill scripts on every exec, and asks.
    script = f"sh tool.sh; sh tool.sh; ln -sf {scripts}/tool.sh tool.sh; sh tool.sh; echo s=$?"
    rules = 'prefix_rule(["sh"], "allow")\n'
    stdout, stderr, log = run_session(user, base, rules, script, ("--on-prompt", "deny"))
    assert stdout.count("plain ran") == 2, (stdout, stderr)
    assert "skill ran" not in stdout and "s=0" not in stdout, (stdout, stderr)
    assert "skill script" in stderr, stderr
    assert escalations(log, "sh tool.sh") == [False, False], log


def test_a_server_that_is_behind_loses_no_record_of_a_standing_claim(tmp_path: Path) -> None:
    """The launcher reports each standing claim before its program starts, on a socket the
    server reads in batches. While the server does not read at all (stopped here), claims go
    on until that socket is full; then a claim is a miss and asks the server, which answers
    once it runs again. No claim runs unrecorded: every escalation has exactly one record,
    standing or not, naming the claimer and its parent, in the order they ran."""
    base = tmp_path
    base.chmod(0o755)
    ws, out = folders(base)
    (out / "r").touch()
    (base / "r.rules").write_text('prefix_rule(["touch"], "allow")\n')
    time.sleep(1.05)  # the files are a second old: standing may be offered
    count = 1500  # far more reports than the socket holds
    script = (
        f"touch {out}/r; touch {out}/r; echo $EXECGATE_SOCKET > {ws}/socket; echo $$ > {ws}/shell; "
        f"while [ ! -e {ws}/go ]; do sleep 0.02; done; "
        f"for i in $(seq 1 {count}); do touch {out}/r; echo $i > {ws}/n; done; echo alive"
    )
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(base / "r.rules"), *MODE,
           "--", "bash", "-c", script]  # fmt: skip
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    # The slow path: this very process is the server.
    env = {**os.environ, "EXECGATE_HOME": str(base / "home"), "PATH": path,
           "EXECGATE_FAST_START": "0"}  # fmt: skip
    session = subprocess.Popen(cmd, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    blocked = False
    try:
        deadline = time.monotonic() + 120
        while not (ws / "shell").exists():
            assert time.monotonic() < deadline and session.poll() is None
            time.sleep(0.02)
        os.kill(session.pid, signal.SIGSTOP)
        (ws / "go").touch()
        # Until a claim asks the stopped server (a connection waits in its gate socket's
        # accept queue: the report socket was full), or the loop ends.
        gate = (ws / "socket").read_text().strip()
        while not blocked and session.poll() is None and time.monotonic() < deadline:
            listing = subprocess.run(["ss", "-xlH", "src", gate], capture_output=True, text=True)
            blocked = any(int(line.split()[2]) > 0 for line in listing.stdout.splitlines())
            time.sleep(0.02)
    finally:
        os.kill(session.pid, signal.SIGCONT)
    stdout, stderr = session.communicate(timeout=180)
    assert "alive" in stdout.decode(), stderr
    lines = (base / "home" / "log" / "escalations.log").read_text().splitlines()
    claims = escalations(lines, f"touch {out}/r")
    assert len(claims) == count + 2, stderr
    assert claims[:2] == [False, True]
    assert blocked, "the loop never had to ask the server"  # (the socket holds far fewer)
    assert not all(claims[2:])  # that claim was the server's (then standing again)
    shell = int((ws / "shell").read_text())
    records = [json.loads(line) for line in (base / "home" / "log" / "decisions.jsonl").open()]
    touches = [r for r in records if r.get("argv") == ["touch", f"{out}/r"]]
    assert len(touches) == count + 2
    standing = [r for r in touches if r["via"] == "standing"]
    assert standing and all(r["ppid"] == shell for r in standing), standing[:3]
    times = [r["time"] for r in touches]
    assert times == sorted(times)  # in the order they ran, batches or not


GRAB = r"""
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
launcher = int(sys.argv[1])
got = []
for n in range(256):
    try:
        os.close(os.open(f"/proc/{launcher}/fd/{n}", os.O_RDWR))
        got.append(f"open {n}")
    except OSError:
        pass
pidfd = libc.syscall(434, launcher, 0)  # pidfd_open
for n in range(256 if pidfd >= 0 else 0):
    if libc.syscall(438, pidfd, n, 0) >= 0:  # pidfd_getfd
        got.append(f"getfd {n}")
for n in os.listdir("/proc/self/fd"):
    try:
        kind = socket.socket(fileno=os.dup(int(n))).type
    except OSError:
        continue
    if kind == socket.SOCK_SEQPACKET:
        got.append(f"own {n}")
print("got", got)
"""


def test_a_sandboxed_process_cannot_reach_the_report_socket(place: tuple[Any, Path]) -> None:
    """Once standing authorizations exist, the launcher holds their report socket: nothing in
    the sandbox can open its descriptors (/proc/PID/fd), take one (pidfd_getfd) or inherit
    one, so no claim's report can be forged or suppressed."""
    user, base = place
    ws, out = folders(base)
    (out / "r").touch()
    (ws / "grab.py").write_text(GRAB)
    script = f'touch {out}/r; touch {out}/r; python3 {ws}/grab.py "$PPID"; echo alive'
    stdout, stderr, log = run_session(user, base, 'prefix_rule(["touch"], "allow")\n', script)
    assert "alive" in stdout, (stdout, stderr)
    assert escalations(log, f"touch {out}/r") == [False, True], log  # one is standing
    assert "got []" in stdout, stdout
