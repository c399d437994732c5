"""A server killed with SIGKILL cannot remove its session folder; the next server does, and
never removes the folder of a session that is still running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .conftest import EXECGATE, Gate


def _start(gate: Gate, runtime: Path, script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EXECGATE, "run", "--rules", str(gate.rules), "--", "bash", "-c", script],
        env={**gate.env, "XDG_RUNTIME_DIR": str(runtime)},
        cwd=gate.root,
        stdout=subprocess.PIPE,
    )


def _session_folder(proc: subprocess.Popen[bytes]) -> Path:
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # the gated shell prints its socket
    assert line.startswith("/"), line
    return Path(line).parent


def test_stale_session_folder_is_removed_live_one_kept(gate: Gate) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="egrt-", dir="/tmp"))  # short: socket paths fit
    gate.write_rules("")
    hold = 'echo "$EXECGATE_SOCKET"; read -r _ < /dev/zero; exec -a {tag} sleep 1000'
    killed = _start(gate, runtime, hold.format(tag=f"{gate.tag}-killed"))
    live = _start(gate, runtime, f'echo "$EXECGATE_SOCKET"; exec -a {gate.tag}-live sleep 1000')
    try:
        stale, kept = _session_folder(killed), _session_folder(live)
        folder = runtime / f"execgate-sessions-{os.getuid()}"  # every sandbox keeps it read-only
        assert stale.parent == folder and kept.parent == folder
        os.kill(killed.pid, signal.SIGKILL)  # the server: no chance to clean up
        killed.wait(timeout=30)
        assert stale.is_dir()
        result = gate.run("echo next", env={"XDG_RUNTIME_DIR": str(runtime)})
        assert result.stdout == b"next\n", result.stderr
        assert not stale.exists()
        assert kept.is_dir() and (kept / "gate.sock").exists()
        assert live.poll() is None
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        shutil.rmtree(runtime, ignore_errors=True)
    deadline = time.monotonic() + 30
    while gate.leftovers() and time.monotonic() < deadline:  # the killed one's launcher ends
        time.sleep(0.1)
