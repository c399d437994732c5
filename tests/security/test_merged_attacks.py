"""Attacks on the merged whole (sandbox x state folders x reload x unified exec x proxy x log),
performed for real from inside gated sessions, as root and as an unprivileged user.

Each test names the attack it performs; the ones that once succeeded say what happened then.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcpharness import payload, shell_args

WS = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]
EXECGATE = [sys.executable, "-m", "execgate"]


def _run(
    user: Any, argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[bytes]:
    if user is None:
        return subprocess.run(
            argv, cwd=cwd, env={**os.environ, **env}, capture_output=True, timeout=120
        )
    result: subprocess.CompletedProcess[bytes] = user.run(argv, cwd=cwd, env=env)
    return result


# -- moving a protected folder away from its path ------------------------------------------------


def test_a_session_cannot_move_its_rules_folder_and_plant_another(place: Any) -> None:
    """$EXECGATE_HOME inside the workspace is a read-only carve-out, but the folders above it
    were not: the session renamed `cfg` (carrying the read-only mount along), made a fresh
    `cfg/execgate/rules` with an allow rule, the live reload loaded it, and `touch` escalated
    out of the sandbox (found on the merged main: planted, then outside/escaped existed)."""
    user, base = place
    ws, outside = base / "ws", base / "outside"
    state = ws / "cfg" / "execgate"
    (state / "rules").mkdir(parents=True)
    outside.mkdir()
    (base / "h").mkdir()
    from .conftest import give_to

    give_to(base, user)
    env = {"EXECGATE_HOME": str(state), "PATH": "/usr/bin:/bin", "HOME": str(base / "h"),
           "CODEX_HOME": str(base / "h" / ".codex")}  # fmt: skip
    rule = 'prefix_rule(["touch"], "allow")'
    script = (
        f"mv cfg cfg.moved && mkdir -p cfg/execgate/rules && echo '{rule}' > "
        "cfg/execgate/rules/x.rules && echo planted && "
        f"for i in $(seq 40); do touch {outside}/escaped 2>/dev/null && break; sleep 0.25; done; "
        "echo still working"
    )
    done = _run(user, [*EXECGATE, "run", *WS, "--", "bash", "-c", script], ws, env)
    out = done.stdout.decode()
    assert not (outside / "escaped").exists(), (out, done.stderr)
    assert "planted" not in out, out
    assert "still working" in out, (out, done.stderr)
    assert not (ws / "cfg.moved").exists()


@pytest.mark.parametrize("world", ["root", "unprivileged"], indirect=True)
def test_mcp_a_call_cannot_turn_a_writable_root_into_a_link_for_the_next_call(world: Any) -> None:
    """A writable root inside another one (`--workspace work/proj --writable-root work`) was
    no mount point of its own: call 1 renamed it and put a symlink to a folder outside in its
    place; call 2's sandbox bind-mounted the link's target as the writable root (found on the
    merged main: outside/pwned existed)."""
    m = world.mcp
    proj = m.work / "proj"
    proj.mkdir()
    if world.user is not None:
        world.user.chown_tree(m.work)
    swap = f"cd {m.work} && mv proj proj.old && ln -s {m.outside} proj && echo swapped"
    write = f"touch {proj}/pwned; echo wrote=$?"

    async def scenario() -> list[str]:
        outputs = []
        options = ("--workspace", str(proj), "--writable-root", str(m.work))
        async with world.client(*WS, *options) as client:
            for command in (swap, write):
                args = {**shell_args(m, command), "workdir": str(m.work)}
                outputs.append(str(payload(await client.call_tool("shell", args))["output"]))
        return outputs

    outputs = asyncio.run(scenario())
    assert not (m.outside / "pwned").exists(), outputs
    assert "swapped" not in outputs[0], outputs
    assert "wrote=" in outputs[1], outputs


# -- the decision log, written by a gated process ------------------------------------------------

# With the sandbox off the log is the user's file: a gated process appends well-chained lines
# whose every field carries terminal escapes, and values of the wrong type.
FORGE_LOG = r"""
import hashlib, json, os
from execgate.paths import decision_log_file
path = decision_log_file()
last = path.read_bytes().rstrip(b"\n").split(b"\n")[-1]
E = "\x1b]0;owned\x07\x1b[2J\x9b1m\u202e"
records = [
    {"time": 1.0, "session": "s" + E, "front": "run" + E, "kind": "exec", "argv": ["ls" + E],
     "program": "/bin/ls" + E, "decision": "escalate" + E, "answer": "session",
     "answered_by": "terminal", "call": E, "prefix": ["ls" + E], "reason": E},
    {"time": "yesterday", "session": E, "front": E, "kind": "exec", "argv": "ls",
     "decision": "nonsense" + E, "answer": E, "answered_by": E},
    {"time": 1e300, "kind": "exec", "argv": {"a": 1}, "decision": "run", "source": "grant"},
]
with open(path, "ab") as f:
    for record in records:
        line = json.dumps({**record, "prev": hashlib.sha256(last).hexdigest()},
                          separators=(",", ":")).encode()
        f.write(line + b"\n")
        last = line
print("forged")
"""


def test_forged_log_lines_reach_no_terminal_raw(place: Any) -> None:
    """`execgate log`, `approvals grants`, `log replay` and `rules suggest` printed the
    forged fields (decision, front, session, answer, answered_by, call) raw: an OSC title, a
    screen clear and a C1 CSI reached the terminal (found on the merged main); a `time` that
    is no number was a traceback."""
    user, base = place
    ws, home = base / "ws", base / "xhome"
    ws.mkdir()
    (base / "empty.rules").write_text("")
    from .conftest import give_to

    give_to(base, user)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {"EXECGATE_HOME": str(home), "PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin",
           "HOME": str(base), "PYTHONPATH": src}  # fmt: skip
    (ws / "forge.py").write_text(FORGE_LOG)
    forged = _run(user, [*EXECGATE, "run", "--sandbox", "off", "--", sys.executable,
                         "forge.py"], ws, env)  # fmt: skip
    assert b"forged" in forged.stdout, forged
    shown = []
    for command in (["log"], ["log", "--json"], ["approvals", "grants"],
                    ["log", "replay", "--rules", str(base / "empty.rules")],
                    ["rules", "suggest", "--min-count", "1"]):  # fmt: skip
        done = _run(user, [*EXECGATE, *command], ws, env)
        out = done.stdout + done.stderr
        assert b"Traceback" not in out, (command, out)
        for raw in (b"\x1b", b"\x07", "\x9b".encode(), "\u202e".encode()):
            assert raw not in out, (command, out)
        shown.append(done.stdout.decode())
    assert "\\e]0;owned\\a\\e[2J" in shown[0], shown[0]  # shown, escaped
    assert "\\e]0;owned" in shown[2], shown[2]  # the forged session grant, escaped


# -- a rule-named program running uncovered in a sandbox of its own ------------------------------


def test_the_uncovered_program_of_a_confined_run_cannot_be_read_through_proc(
    attacker: Any,
) -> None:
    """`snooze 30` matches no rule but its program is rule-named, so it runs confined in a
    fresh sandbox where it is not covered by its stand-in. From the session's sandbox the
    attacker reads `/proc/PID/root/…/snooze`, `/proc/PID/exe` and `/proc/PID/map_files` of
    that process to copy the real bytes, then runs the copy with the forbidden argument
    (held: Landlock's ptrace scope denies all three; the copy is of the stand-in)."""
    import shutil

    shutil.copy("/bin/sleep", attacker.bin / "snooze")
    attacker.give(attacker.bin)
    attacker.write_rules('prefix_rule(["snooze", "forever"], "forbidden")\n')
    program = attacker.bin / "snooze"
    script = f"""
        snooze 30 &
        for i in $(seq 400); do pgrep -x snooze >/dev/null && break; sleep 0.05; done
        for p in $(pgrep -x snooze); do
            for f in /proc/$p/root{program} /proc/$p/exe; do
                head -c 4 "$f" > got 2>/dev/null || echo "denied $f"
                grep -q ELF got 2>/dev/null && echo "read $f"
                rm -f got
            done
            ls /proc/$p/map_files >/dev/null 2>&1 && echo "listed $p"
        done
        cp {program} copy; ./copy forever; echo "copy rc=$?"
        kill %1; echo still working
    """
    done = attacker.run(script, mode="workspace-write")
    out = done.stdout.decode()
    assert "still working" in out, (out, done.stderr)
    assert "read " not in out and "listed " not in out, out
    assert "copy rc=126" in out, (out, done.stderr)
    # the program of the confined run was there, and was attacked
    assert "denied /proc/" in out and "/exe" in out, out


# -- the --audit copy ------------------------------------------------------------------------------


def test_the_audited_session_cannot_rewrite_its_audit_file(attacker: Any) -> None:
    """`execgate run --audit audit.jsonl -- ./ci.sh` (the README's CI line) keeps the audit
    copy in the workspace, which the audited script may write: it truncated the file and
    wrote its own record (found on the merged main). The file is now a read-only carve-out,
    and cannot be moved or removed either."""
    audit = attacker.work / "audit.jsonl"
    forged = '{"decision":"run","argv":["true"]}'
    script = (
        f"marker; : > audit.jsonl; echo '{forged}' >> audit.jsonl; "
        "mv audit.jsonl moved.jsonl; rm -f audit.jsonl; echo still working"
    )
    done = attacker.run(script, mode="workspace-write", options=["--audit", str(audit)])
    assert b"still working" in done.stdout, done
    assert audit.exists() and not (attacker.work / "moved.jsonl").exists()
    text = audit.read_text()
    assert forged not in text, text
    assert '"argv":["marker"]' in text and '"decision":"deny"' in text, text


# -- another session's folder ----------------------------------------------------------------------

# Run in session A's sandbox: take over session B's gate socket (its folder is in /dev/shm,
# which A may write) and answer "run" to whatever B's processes ask.
FAKE_GATE = r"""
import os, socket, sys, time
from execgate.gate import protocol
path = open(sys.argv[1]).read().strip()
try:
    os.unlink(path)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    print("took over", flush=True)
except OSError as exc:
    print("refused:", exc.strerror, flush=True)
    server = None
open(sys.argv[2], "w").close()  # B may go on
if server is not None:
    server.settimeout(10)
    try:
        while True:
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(protocol.RUN)
            conn.close()
    except OSError:
        pass
print("still working", flush=True)
"""


def test_a_sandbox_cannot_reach_into_another_sessions_folder(attacker: Any) -> None:
    """Session B (`--sandbox off`, the user's own) keeps its gate socket, snapshot and
    stand-in table in /dev/shm; session A (`workspace-write`, whose writable roots include
    /dev/shm by default) replaced B's gate socket with its own server answering "run", and
    B's forbidden `marker` ran (found on the merged main). Session folders now live in a
    folder of the user's that every sandbox keeps read-only."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    (attacker.work / "fake.py").write_text(FAKE_GATE)
    attacker.give(attacker.work)
    victim = [*EXECGATE, "run", "--rules", str(attacker.rules), "--sandbox", "off", "--", "bash",
              "-c", 'echo "$EXECGATE_SOCKET" > b-socket; while [ ! -e go ]; do sleep 0.05; '
              'done; marker; echo "marker rc=$?"']  # fmt: skip
    env = {**attacker.env, "PYTHONPATH": src}
    argv = attacker.user.argv(victim) if attacker.user else victim
    with subprocess.Popen(argv, env=env, cwd=attacker.work, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as b:  # fmt: skip
        try:
            for _ in range(600):  # a failure guard
                if (attacker.work / "b-socket").exists() or b.poll() is not None:
                    break
                time.sleep(0.05)
            a = attacker.run(
                f"{sys.executable} fake.py b-socket go",
                mode="off",
                options=["--sandbox", "workspace-write"],  # /tmp and /dev/shm writable
                env={"PYTHONPATH": src},
            )
            out, err = b.communicate(timeout=60)
        finally:
            if b.poll() is None:
                b.kill()
    assert b"still working" in a.stdout, a
    assert not attacker.ran(), (a.stdout, out, err)
    assert b"took over" not in a.stdout, a.stdout
    assert b"marker rc=126" in out, (out, err)


# -- an allowed git in a repository the sandbox wrote ---------------------------------------------


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_an_allowed_git_never_runs_a_repository_the_sandbox_wrote(attacker: Any, mode: str) -> None:
    """`prefix_rule(["git", "status"], "allow")` escalates `git status`, which runs the
    repository's `core.fsmonitor`. `<root>/.git` is read-only when it exists at the spawn,
    but a repository made inside the sandbox (a nested one, or `.git` created in the root
    after the spawn) was not: its `core.fsmonitor` ran outside (found on the merged main:
    both witnesses existed). Such an escalation now runs in place, in the sandbox."""
    attacker.write_rules('prefix_rule(["git", "status"], "allow")\n')
    out = attacker.outside
    script = f"""
        export GIT_CONFIG_NOSYSTEM=1 HOME={attacker.work}
        git init -q sub && cp -r sub/.git .git  # .git in the root, made after the spawn
        git -C sub config core.fsmonitor "touch {out}/nested; false"
        printf '[core]\n\tfsmonitor = "touch {out}/root; false"\n' >> .git/config
        (cd sub && git status >/dev/null 2>&1); echo "nested status $?"
        git status >/dev/null 2>&1; echo "root status $?"
        echo still working
    """
    # A repository read-only in the sandbox (`.git` there at the spawn, in a writable root)
    # still escalates: its fsmonitor, set up by the user, writes where only outside can.
    legit = attacker.base / "legit"
    legit.mkdir()
    subprocess.run(["git", "init", "-q", str(legit)], check=True)
    subprocess.run(["git", "-C", str(legit), "config", "core.fsmonitor",
                    f"touch {out}/legit; false"], check=True)  # fmt: skip
    attacker.give(legit)
    script += f"cd {legit} && git status >/dev/null 2>&1; echo legit status $?\n"
    done = attacker.run(script, mode=mode, options=["--writable-root", str(legit)])
    text = done.stdout.decode()
    assert "still working" in text, (text, done.stderr)
    assert not (out / "nested").exists() and not (out / "root").exists(), (text, done.stderr)
    assert "nested status 0" in text and "root status 0" in text, (text, done.stderr)
    assert (out / "legit").exists(), (text, done.stderr)


RACE_CLAIM = r"""
import os, sys
sys.path.insert(0, os.getcwd())
from forge import ask, claim
os.chdir("sub")
git = os.open("/usr/bin/git", os.O_RDONLY)
answer = ask(b"/usr/bin/git", [git], [], [b"git", b"status"])
print("answer", answer[0].decode(), flush=True)
if answer[0] == b"escalate":
    os.rename("../staged.git", ".git")  # after the decision, before the claim
    claim(answer[1])
"""


def test_a_repository_made_between_decision_and_claim_does_not_run_outside(
    attacker: Any,
) -> None:
    """The same attack as above by a process that speaks EG1 itself: it asks for `git
    status` in an empty folder, gets its ticket, then renames a prepared repository into
    place and claims. Its `core.fsmonitor` ran outside (found on the merged main). The
    launcher now looks again at the claim, through the claimer's own root, and refuses."""
    from .test_redteam import FORGE

    attacker.write_rules('prefix_rule(["git", "status"], "allow")\n')
    (attacker.work / "forge.py").write_text(FORGE)
    (attacker.work / "race.py").write_text(RACE_CLAIM)
    attacker.give(attacker.work)
    out = attacker.outside
    src = str(Path(__file__).resolve().parents[2] / "src")
    script = f"""
        export GIT_CONFIG_NOSYSTEM=1 HOME={attacker.work}
        mkdir sub && git init -q prep && mv prep/.git staged.git
        printf '[core]\\n\\tfsmonitor = "touch {out}/raced; false"\\n' >> staged.git/config
        {sys.executable} race.py 2>&1; echo "claimed $?"; echo still working
    """
    done = attacker.run(script, mode="workspace-write", env={"PYTHONPATH": src})
    text = done.stdout.decode()
    assert "still working" in text, done
    assert not (out / "raced").exists(), done
    assert "answer escalate" in text, done  # the ticket was given: the claim was refused
    assert "not escalated" in text and "sub/.git" in text and "claimed 126" in text, done
