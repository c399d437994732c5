"""The server of a native start (docs/protocol.md §8): what ``execgate-run`` (native/front.c)
starts as S once it has opened a session from a start-up plan.

The front has written the first exec's decision record itself (native/chain.c) and starts the
command while this server starts: it serves the session as ``execgate run`` would
(:func:`execgate.cli.run.serve_adopted`), after checking that what it computes itself equals
what the front used.

Command line (the front's; not for people)::

    PLAN_FD LISTEN_FD SNAPSHOT_FD CONTROL_FD DONE_FD SESSION_DIR TOKEN ESCALATED_TOKEN
    SESSION_ID PROGRAM REALPATH CWD -- COMMAND...

DONE_FD: a pipe on which this server writes its exit status once its session is closed and its
records are written (the front then need not wait for the event loop's and the kernel's
teardown of the interpreter).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from execgate.gate import runplan


class FrontStart:
    """What the native front did before this server started (its command line). A plain
    class: dataclasses would cost this start tens of milliseconds of imports."""

    def __init__(self, argv: list[str]) -> None:
        if len(argv) < 14 or argv[12] != "--":
            raise SystemExit("execgate: error: the server of a native start was started wrongly")
        plan_fd, self.listen_fd, self.snapshot_fd, self.control_fd, self.done_fd = map(
            int, argv[:5]
        )
        os.set_inheritable(self.done_fd, False)  # (its EOF: this server is gone)
        try:
            self.plan = runplan.read_fd(plan_fd)
        finally:
            os.close(plan_fd)
        self.session_dir = Path(argv[5])
        self.token, self.escalated_token, self.session_id = argv[6:9]
        self.program, self.realpath, self.cwd = argv[9:12]
        self.command = argv[13:]
        self.front_pid = os.getppid()

    def say_done(self, status: int) -> None:
        """Tell the front this server is done, with its exit status (once: later calls do
        nothing). Its records are written by then: the front may exit."""
        if self.done_fd < 0:
            return
        with contextlib.suppress(OSError):
            os.write(self.done_fd, bytes([status & 0xFF]))
        os.close(self.done_fd)
        self.done_fd = -1


def main() -> None:
    start = FrontStart(sys.argv[1:])
    # Started as the slow path was (``-c`` otherwise): it finds execgate's installation from
    # it (sandbox/guarded.py), and the plan's sandbox carves that out.
    sys.argv[0] = start.plan.argv0
    from execgate.cli import entry_with
    from execgate.cli.run import serve_adopted

    entry_with(lambda: serve_adopted(start), done=start.say_done)
