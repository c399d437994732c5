"""A session that kills its own launcher: nothing it started outlives the session.

With the sandbox off a gated process can signal the session's ``execgate-launch`` (same user).
Its descendants are then adopted by the server (a child subreaper), which kills them.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from typing import TYPE_CHECKING

from .conftest import EXECGATE, Gate

if TYPE_CHECKING:  # the fixture's type (tests/conftest.py)
    from conftest import UnprivilegedUser

# Three background processes (one in a session of its own, one double-forked), then SIGKILL to
# the launcher, found by walking up /proc from this shell.
KILL_THE_LAUNCHER = r"""
(exec -a {tag}-a sleep 1000) &
(setsid bash -c 'exec -a {tag}-b sleep 1000' &) &
( (exec -a {tag}-c sleep 1000) & ) &
sleep 0.5
p=$$
while [ "$p" -gt 1 ]; do
    read -r comm < /proc/$p/comm
    if [ "$comm" = execgate-launch ]; then echo killing; kill -9 "$p"; break; fi
    read -r _ _ _ p _ < /proc/$p/stat
done
exec -a {tag}-main sleep 1000
"""


def _survivors(tag: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", tag], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def _wait_none(tag: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout  # a failure guard: they are killed right away
    while (left := _survivors(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_killed_launcher_leaves_nothing_behind(gate: Gate) -> None:
    gate.write_rules("")
    result = gate.run(KILL_THE_LAUNCHER.format(tag=gate.tag), timeout=60)
    assert b"killing" in result.stdout, result.stderr
    assert b"the session launcher exited" in result.stderr, result.stderr
    assert _wait_none(gate.tag) == []


def test_killed_launcher_leaves_nothing_behind_strict_exec_escalated(gate: Gate) -> None:
    """From a workspace-write, strict-exec session, through an escalated (allowed) shell."""
    gate.write_rules('prefix_rule(["bash", "-c"], "allow")\n')
    script = KILL_THE_LAUNCHER.format(tag=gate.tag)
    result = gate.run(
        ["bash", "-c", f"bash -c {shlex.quote(script)}"],
        options=["--sandbox", "workspace-write", "--strict-exec"],
        timeout=60,
    )
    assert b"killing" in result.stdout, result.stderr
    assert b"the session launcher exited" in result.stderr, result.stderr
    assert _wait_none(gate.tag) == []


def test_killed_launcher_leaves_nothing_behind_unprivileged(
    unprivileged: UnprivilegedUser,
) -> None:
    folder = unprivileged.make_dir()
    rules = folder / "empty.rules"
    rules.write_text("")
    unprivileged.chown_tree(folder)
    tag = f"egtag{folder.name[-8:]}x"
    command = [*EXECGATE, "run", "--rules", str(rules), "--", "bash", "-c"]
    result = unprivileged.run([*command, KILL_THE_LAUNCHER.format(tag=tag)], cwd=folder)
    assert b"killing" in result.stdout, result.stderr
    assert b"the session launcher exited" in result.stderr, result.stderr
    assert _wait_none(tag) == []
