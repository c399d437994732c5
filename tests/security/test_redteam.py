"""Red-team findings: attacks from inside a gated session that succeed today.

Each test performs the attack for real inside `execgate run`, as root and as an unprivileged
user, and asserts that the forbidden thing did not happen. They fail until the finding is fixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import give_to

WS = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]
MODES = {"workspace-write": WS, "strict-exec": [*WS, "--strict-exec"]}
SRC = str(Path(__file__).resolve().parents[2] / "src")

# Speaks EG1 with the session's own socket and token: the helper every finding below uses.
FORGE = textwrap.dedent(
    """
    import os, socket, sys
    from execgate.gate import protocol as P
    def ask(path, fds, interps, argv, cwd=None):
        req = P.ExecRequest(token=os.environb[b"EXECGATE_TOKEN"], via="execve", pid=os.getpid(),
            ppid=os.getppid(), cwd=cwd or os.getcwdb(), path=path, interpreters=tuple(interps),
            argv=tuple(argv))
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(os.environ["EXECGATE_SOCKET"])
            socket.send_fds(s, [P.encode_exec_request(req)], fds)
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        return P.split_payload(answer[4:]) if answer else [b"closed"]
    def claim(ticket):
        os.execv(os.environ["EXECGATE_WRAPPER"], ["execgate-claim", ticket.decode()])
    """
)


def _run(user, ws: Path, rules: Path, mode: str, script: str, base: Path):  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *MODES[mode],
           "--", "bash", "-c", script]  # fmt: skip
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": "/usr/bin:/bin", "PYTHONPATH": SRC}
    if user is None:
        return subprocess.run(cmd, cwd=ws, env={**os.environ, **env}, capture_output=True,
                              timeout=120)  # fmt: skip
    return user.run(cmd, cwd=ws, env=env)


# The script path in the command judged for an interpreter is the caller's PATH claim, but the
# escalated interpreter is handed the canonical path of the descriptor: a rule that allows one
# script under an interpreter (`sh /opt/tool.sh`) escalates any script of the attacker's.
SCRIPT_CLAIM = textwrap.dedent(
    """
    import os
    from forge import ask, claim
    p = os.open("evil.sh", os.O_RDONLY)
    sh = os.open("/bin/sh", os.O_RDONLY)
    a = ask(SAFE, [p, sh], [(b"/bin/sh", b"")], [SAFE])
    print("answer", a[0].decode(), flush=True)
    if a[0] == b"escalate":
        claim(a[1])
    """
)


@pytest.mark.parametrize("mode", MODES)
def test_interpreter_rule_escalates_only_the_script_it_names(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    ws, outside, safe_dir = base / "ws", base / "outside", base / "safe"
    for d in (ws, outside, safe_dir):
        d.mkdir()
    safe = safe_dir / "safe.sh"  # the one script the user allows, not writable from inside
    safe.write_text("#!/bin/sh\necho safe\n")
    safe.chmod(0o755)
    rules = base / "r.rules"
    rules.write_text(f'prefix_rule(["/bin/sh", "{safe}"], "allow")\n')
    (ws / "forge.py").write_text(FORGE)
    (ws / "attack.py").write_text(f"SAFE = {os.fsencode(safe)!r}\n" + SCRIPT_CLAIM)
    evil = ws / "evil.sh"
    evil.write_text(f"#!/bin/sh\necho escaped > {outside}/escaped\necho evil ran\n")
    evil.chmod(0o755)
    give_to(base, user)
    r = _run(user, ws, rules, mode, "/usr/bin/python3 attack.py; echo alive", base)
    out = r.stdout.decode()
    assert "alive" in out, (out, r.stderr)
    # Today: "answer escalate", "evil ran", and outside/escaped exists.
    # evil.sh may run, but only confined: it is an exec of a stand-in's program (/bin/sh is
    # rule-named, so its path inside the sandbox is a stand-in), whose "run" is a confined
    # escalation — what it writes outside the workspace must not appear.
    assert not (outside / "escaped").exists(), out


# -- answering the terminal prompt from inside the session ----------------------------------

# The user's tmux server is a pathname socket: unless the sandbox hides its folder, a gated
# process types the answer into its own pane. (With the sandbox off a same-user process can
# always do so, also with ioctl(TIOCSTI): docs/threat-model.md; seccomp refuses TIOCSTI inside.)
TMUX_KEYS = "(sleep 1.5; tmux send-keys o Enter; echo $? > sent) &"


def _in_tmux(user, base: Path, ws: Path, argv: list[str], env: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    """Run ``argv`` in a pane of a private tmux server (as ``user``); once the attack is over
    (``ws/sent``), answer the prompt "n" as the human would; return what it printed."""
    import shlex
    import time

    sock, out, done = base / "tmux" / "default", base / "pane.out", base / "pane.done"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    line = (f"cd {shlex.quote(str(ws))} && env {exports} {shlex.join(argv)} "
            f"> {out} 2>&1; touch {done}; sleep 30")  # fmt: skip
    tmux = ["tmux", "-S", str(sock), "new-session", "-d", "-x", "200", "-y", "50", line]
    full_env = {**os.environ, "TERM": "xterm"}
    subprocess.run(user.argv(tmux) if user else tmux, env=full_env, check=True, timeout=30)
    try:
        for _ in range(300):
            if (ws / "sent").exists():
                break
            time.sleep(0.1)
        keys = ["tmux", "-S", str(sock), "send-keys", "n", "Enter"]
        subprocess.run(user.argv(keys) if user else keys, env=full_env, timeout=30)
        for _ in range(300):
            if done.exists():
                break
            time.sleep(0.1)
        return out.read_text() if out.exists() else ""
    finally:
        kill = ["tmux", "-S", str(sock), "kill-server"]
        subprocess.run(user.argv(kill) if user else kill, env=full_env, timeout=30)


@pytest.mark.parametrize("mode", MODES)
def test_a_gated_process_cannot_answer_its_own_prompt(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    ws, outside = base / "ws", base / "outside"
    for folder in (ws, outside, base / "tmux"):
        folder.mkdir()
    (base / "tmux").chmod(0o700)
    rules = base / "r.rules"
    rules.write_text('prefix_rule(["touch"], "prompt")\n')
    give_to(base, user)
    script = f"{TMUX_KEYS} touch {outside}/approved; echo touched=$?; wait"
    options = MODES[mode]
    argv = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *options,
            "--", "bash", "-c", script]  # fmt: skip
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": "/usr/bin:/bin", "HOME": str(base)}
    out = _in_tmux(user, base, ws, argv, env)
    assert "touched=" in out, out  # the question was asked and answered (by the human)
    assert (ws / "sent").read_text().strip() != "0", out  # send-keys could not reach tmux
    # Before: touched=0 and outside/approved exists: the session approved its own `touch`.
    assert not (outside / "approved").exists(), out


# -- the project's rules folders, created from inside ---------------------------------------


@pytest.mark.parametrize("folder", [".execgate", ".codex"])
@pytest.mark.parametrize("mode", MODES)
def test_a_session_cannot_create_the_project_rules_folder(place, mode: str, folder: str) -> None:  # type: ignore[no-untyped-def]
    """`--protect` only covers `.execgate`/`.codex` that exist at spawn time: a sandboxed
    command in a trusted project that has none creates `<project>/.execgate/rules/x.rules`
    with an allow rule, and the next session in that project escalates by it."""
    user, base = place
    ws, outside = base / "ws", base / "outside"
    ws.mkdir()
    outside.mkdir()
    give_to(base, user)
    eg = [sys.executable, "-m", "execgate"]
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": "/usr/bin:/bin", "HOME": str(base / "h"),
           "CODEX_HOME": str(base / "h" / ".codex")}  # fmt: skip

    def run(*argv: str) -> subprocess.CompletedProcess[bytes]:
        if user is None:
            return subprocess.run([*eg, *argv], cwd=ws, env={**os.environ, **env},
                                  capture_output=True, timeout=120)  # fmt: skip
        return user.run([*eg, *argv], cwd=ws, env=env)

    assert run("trust", str(ws)).returncode == 0
    plant = (f"mkdir -p {folder}/rules && "
             f"echo 'prefix_rule([\"touch\"], \"allow\")' > {folder}/rules/x.rules; "
             "echo planted=$?")  # fmt: skip
    first = run("run", *MODES[mode], "--", "bash", "-c", plant)
    second = run("run", *MODES[mode], "--", "touch", str(outside / "escaped"))
    # Today: planted=0, and the second session's touch is escalated: outside/escaped exists.
    assert not (outside / "escaped").exists(), (first.stdout, second.stderr)
    assert not (ws / folder / "rules" / "x.rules").exists(), first.stdout


# -- the launcher's claim socket holds any number of big half-sent frames --------------------

FLOOD = textwrap.dedent(
    """
    import os, socket, struct, subprocess, time
    claim = os.path.join(os.path.dirname(os.environ["EXECGATE_SOCKET"]), "claim.sock")
    socks, closed = [], 0
    for i in range(24):  # 15 MiB of a 16 MiB claim frame each, never finished
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)  # a connection left waiting must not hang the test
        s.connect(claim)
        try:
            s.sendall(struct.pack("<I", 16 << 20))
            for _ in range(15):
                s.sendall(b"A" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            closed += 1  # the launcher closed it: beyond its bounds
        socks.append(s)
    print("closed", closed, flush=True)
    p = os.getpid()
    while p > 1 and open(f"/proc/{p}/comm").read().strip() != "execgate-launch":
        p = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
    time.sleep(0.5)
    kb = [l for l in open(f"/proc/{p}/status") if l.startswith("VmRSS")][0].split()[1]
    print("launcher-rss-kb", kb, flush=True)
    print(subprocess.run(["echo", "still-serving"], capture_output=True).stdout.decode())
    """
)


@pytest.mark.parametrize("mode", ["off", *MODES])
def test_claim_socket_memory_is_bounded(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    ws = base / "ws"
    ws.mkdir()
    rules = base / "r.rules"
    rules.write_text('prefix_rule(["marker"], "forbidden")\n')
    (ws / "flood.py").write_text(FLOOD)
    give_to(base, user)
    options = ["--sandbox", "off"] if mode == "off" else MODES[mode]
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *options,
           "--", "/usr/bin/python3", "flood.py"]  # fmt: skip
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": "/usr/bin:/bin"}
    if user is None:
        r = subprocess.run(cmd, cwd=ws, env={**os.environ, **env}, capture_output=True,
                           timeout=120)  # fmt: skip
    else:
        r = user.run(cmd, cwd=ws, env=env)
    out = r.stdout.decode()
    assert "launcher-rss-kb" in out, (out, r.stderr)
    rss_kb = int(out.split("launcher-rss-kb", 1)[1].split()[0])
    # Before the bounds: ~370 MB for 24 connections (4096 were accepted: ~64 GB).
    assert rss_kb < 64 * 1024, out
    assert "still-serving" in out, out  # the session kept working


# -- the prompt's process chain and cwd are the caller's claims -------------------------------

# A forged request under a `prompt` rule, naming pid 1 and a cwd of the forger's choosing: the
# human is shown `process: <pid 1's name> (1)` and that cwd, not the asking process (the server
# has its SO_PEERCRED pid).
FORGED_PROMPT = textwrap.dedent(
    """
    import os
    from forge import ask
    t = os.open("/usr/bin/touch", os.O_RDONLY)
    req_cwd = b"/home/alice/project"
    import socket
    from execgate.gate import protocol as P
    req = P.ExecRequest(token=os.environb[b"EXECGATE_TOKEN"], via="execve", pid=1, ppid=0,
        cwd=req_cwd, path=b"/usr/bin/touch", interpreters=(), argv=(b"touch", b"/tmp/x"))
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["EXECGATE_SOCKET"])
    socket.send_fds(s, [P.encode_exec_request(req)], [t])
    print("asked", os.getpid(), flush=True)
    s.recv(4096)
    """
)


def test_the_prompt_names_the_asking_process_not_its_claims(place) -> None:  # type: ignore[no-untyped-def]
    import time

    user, base = place
    ws = base / "ws"
    ws.mkdir()
    rules = base / "r.rules"
    rules.write_text('prefix_rule(["touch"], "prompt")\n')
    (ws / "forge.py").write_text(FORGE)
    (ws / "prompt.py").write_text(FORGED_PROMPT)
    give_to(base, user)
    sock = base / "tmux.sock"
    argv = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), "--sandbox", "off",
            "--", "/usr/bin/python3", "prompt.py"]  # fmt: skip
    line = (f"cd {ws} && env PYTHONPATH={SRC} EXECGATE_HOME={base / 'home'} PATH=/usr/bin:/bin "
            f"{' '.join(argv)}; sleep 30")  # fmt: skip
    tmux = ["tmux", "-S", str(sock), "new-session", "-d", "-x", "200", "-y", "50", line]
    env = {**os.environ, "TERM": "xterm"}
    subprocess.run(user.argv(tmux) if user else tmux, env=env, check=True, timeout=30)
    screen = ""
    try:
        for _ in range(100):
            time.sleep(0.1)
            cap = ["tmux", "-S", str(sock), "capture-pane", "-p"]
            screen = subprocess.run(user.argv(cap) if user else cap, env=env,
                                    capture_output=True, text=True).stdout  # fmt: skip
            if "Allow?" in screen:
                break
    finally:
        kill = ["tmux", "-S", str(sock), "kill-server"]
        subprocess.run(user.argv(kill) if user else kill, env=env, timeout=30)
    assert "requires approval" in screen, screen
    # Today: "cwd:     /home/alice/project" and "process: <init> (1)".
    assert "/home/alice/project" not in screen, screen
    assert "(1)" not in screen.split("process:", 1)[1].split("\n", 1)[0], screen


@pytest.mark.parametrize("world", ["root", "unprivileged"], indirect=True)
def test_mcp_a_call_cannot_plant_project_rules_for_the_next_call(world) -> None:  # type: ignore[no-untyped-def]
    """The same as above within one `execgate mcp` server: the hot reload watches the missing
    `<workspace>/.execgate/rules` folder, so call 1 plants an allow rule and call 2 escalates."""
    import asyncio

    from mcpharness import payload, shell_args

    m = world.mcp
    assert world.run([sys.executable, "-m", "execgate", "trust", str(m.work)]).returncode == 0
    rule = 'prefix_rule(["touch"], "allow")'
    plant = f"mkdir -p .execgate/rules && echo '{rule}' > .execgate/rules/x.rules; echo planted=$?"

    async def scenario() -> list[str]:
        outputs = []
        async with world.client(*WS, "--reload-interval", "0.1", rules=False) as client:
            for command in (plant, "sleep 1", f"touch {m.outside}/escaped; echo touched=$?"):
                data = payload(await client.call_tool("shell", shell_args(m, command)))
                outputs.append(str(data["output"]))
        return outputs

    outputs = asyncio.run(scenario())
    # Today: planted=0, touched=0 and outside/escaped exists.
    assert not (m.outside / "escaped").exists(), outputs


# -- $EXECGATE_HOME as a writable root --------------------------------------------------------


@pytest.mark.parametrize("how", ["writable-root", "workspace"])
def test_execgate_home_stays_read_only_when_it_is_a_writable_root(place, how: str) -> None:  # type: ignore[no-untyped-def]
    """Inside a writable root, $EXECGATE_HOME is carved out read-only; as the root itself (or
    inside one) it cannot be: the session writing the user's rules and trust list would let the
    next session escalate. Such a session is refused before anything runs."""
    user, base = place
    home, ws, outside = base / "xhome", base / "ws", base / "outside"
    for d in (home, ws, outside):
        d.mkdir()
    give_to(base, user)
    env = {"EXECGATE_HOME": str(home), "PATH": "/usr/bin:/bin", "HOME": str(base / "h"),
           "CODEX_HOME": str(base / "h" / ".codex")}  # fmt: skip
    plant = (f"mkdir -p {home}/rules; "
             f"echo 'prefix_rule([\"touch\"], \"allow\")' > {home}/rules/x.rules; "
             f"echo 'trusted = [\"/\"]' > {home}/trusted-projects.toml; "
             "echo planted=$?")  # fmt: skip
    where = ["--writable-root", str(home)] if how == "writable-root" else []
    cwd = home if how == "workspace" else ws
    eg = [sys.executable, "-m", "execgate", "run", "--sandbox", "workspace-write",
          "--exclude-tmp", "--exclude-tmpdir"]  # fmt: skip

    def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
        if user is None:
            return subprocess.run([*eg, *argv], cwd=cwd, env={**os.environ, **env},
                                  capture_output=True, timeout=120)  # fmt: skip
        return user.run([*eg, *argv], cwd=cwd, env=env)

    first = run(*where, "--", "bash", "-c", plant, cwd=cwd)
    assert first.returncode != 0 and b"planted=" not in first.stdout, first.stdout
    error = first.stderr.decode().strip()
    assert error.startswith("execgate: error:") and str(home) in error, error
    assert len(error.splitlines()) == 1, error
    second = run("--", "touch", str(outside / "escaped"), cwd=ws)
    assert not (home / "rules" / "x.rules").exists(), (first.stdout, first.stderr)
    assert not (home / "trusted-projects.toml").exists()
    assert not (outside / "escaped").exists(), second.stderr
    # The session kept working: a root that merely holds $EXECGATE_HOME is fine.
    third = run("--writable-root", str(base), "--", "bash", "-c", plant, cwd=ws)
    assert b"planted=" in third.stdout, (third.stdout, third.stderr)
    assert not (home / "rules" / "x.rules").exists(), third.stdout
