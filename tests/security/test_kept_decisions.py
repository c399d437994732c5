"""The server keeps the decisions of repeated execs (a loop execs the same command over and
over); what it keeps answers only for the very file it judged. A gated process that makes the
same request again (same name, argv and working directory) for another file gets that file
judged (docs/protocol.md §3: the descriptors are what runs).

Runs for real inside `execgate run` (workspace-write, with --strict-exec), as root and as an
unprivileged user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import give_to

MODES = {
    "workspace-write": ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"],
    "strict-exec": [
        "--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir", "--strict-exec",
    ],
}  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_a_kept_escalation_does_not_answer_for_another_file(place, mode: str) -> None:  # type: ignore[no-untyped-def]
    user, base = place
    outside = base / "outside"
    outside.mkdir()
    ws = base / "ws"
    ws.mkdir()
    rules = base / "r.rules"
    rules.write_text('prefix_rule(["touch"], "allow")\n')
    # Made before the session: inside the sandbox /usr/bin/touch reads as its stand-in.
    shutil.copy2("/usr/bin/touch", ws / "copy")
    give_to(base, user)
    target = outside / "a"
    # The same command, three times through a link to the allowed program (escalated: the
    # decision is kept), then again and again, word for word, with ./tool a copy of it (its
    # content is the named file's, but it is not that file: it runs in place, where `outside`
    # is read-only; strict-exec refuses to run it at all), then a link once more.
    again = f"./tool {target}; echo status=$?; "
    script = (
        "ln -s /usr/bin/touch tool; "
        + again * 3
        + "rm tool; mv copy tool; "
        + again * 3
        + "rm tool; ln -s /usr/bin/touch tool; "
        + again
        + "echo alive"
    )
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(rules), *MODES[mode],
           "--", "bash", "-c", script]  # fmt: skip
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": "/usr/bin:/bin"}
    if user is None:
        r = subprocess.run(cmd, cwd=ws, env={**os.environ, **env}, capture_output=True,
                           timeout=120)  # fmt: skip
    else:
        r = user.run(cmd, cwd=ws, env=env)
    out = r.stdout.decode()
    assert "alive" in out, (out, r.stderr)
    statuses = [line.split("=")[1] for line in out.splitlines() if line.startswith("status=")]
    assert len(statuses) == 7, out
    assert statuses[:3] == ["0", "0", "0"], (out, r.stderr)  # escalated: it wrote outside
    assert "0" not in statuses[3:6], (out, r.stderr)  # the copy never left the sandbox
    assert statuses[6] == "0", (out, r.stderr)  # the named file is escalated again
    log = (base / "home" / "log" / "escalations.log").read_text()
    assert log.count(f"escalated ./tool {target} (program /usr/bin/touch,") == 4, log
