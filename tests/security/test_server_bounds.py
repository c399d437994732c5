"""A gated process cannot make the session's server hold unbounded memory with half-sent
requests (issue 8, item 9), nor hold it up with connections that send nothing (the server
waits for a request's first bytes without a task): excess connections are closed, memory
stays bounded, and the session keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# 24 connections, each announcing a 16 MiB frame and sending half of it (or, "silent", sending
# nothing at all), then holding on.
FLOOD = textwrap.dedent(
    """
    import os, socket, struct, subprocess, sys, time
    held = []
    failed = set()
    chunk = b"x" * (1 << 20)
    silent = sys.argv[1] == "silent"
    for i in range(24):
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.environ["EXECGATE_SOCKET"])
        s.settimeout(5)
        try:
            if not silent:
                s.sendall(struct.pack("<I", 16 << 20))
                for _ in range(8):
                    s.sendall(chunk)
        except OSError:
            failed.add(i)
        held.append(s)

    def closed_by_server(s):
        s.setblocking(False)
        try:
            return s.recv(1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    # The server closes the excess as it gets to them (a busy machine: wait, bounded).
    deadline = time.monotonic() + 20
    while True:
        closed = sum(1 for i, s in enumerate(held) if i in failed or closed_by_server(s))
        if closed >= 24 - 8 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    print("closed", closed, flush=True)
    try:
        print("true", subprocess.run(["/bin/true"]).returncode, flush=True)
    except PermissionError:
        print("true denied", flush=True)
    sys.stdin.readline()  # hold the connections until the test measured the server
    """
)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("flood", ["half-sent", "silent"])
@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_half_sent_requests_cannot_grow_the_server(
    tmp_path: Path, sandbox: str, flood: str
) -> None:
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["true"], "prompt")\n')  # /bin/true asks the server
    (tmp_path / "flood.py").write_text(FLOOD)
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), "--sandbox", sandbox,
           "--on-prompt", "deny", "--", sys.executable, "flood.py", flood]  # fmt: skip
    env = {**os.environ, "EXECGATE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        closed = proc.stdout.readline().decode()
        ran = proc.stdout.readline().decode()
        rss = _rss_mib(proc.pid)  # the server, while the flood holds its connections
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    assert closed.startswith("closed "), (closed, proc.stderr.read() if proc.stderr else b"")
    assert int(closed.split()[1]) >= 24 - 8, closed  # at most 8 unfinished requests are kept
    assert rss < 150, rss  # far below 24 x 8 MiB
    # the session kept answering: the prompt for /bin/true is denied by the server
    assert ran == "true denied\n", ran
