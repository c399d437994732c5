"""The server of a native start (docs/protocol.md §8): what ``execgate-run`` (native/front.c)
starts as S once it has opened a session from a start-up plan and launched the command.

Its first act, with as few imports as it can (``python -I -S``, the plan's ``sys.path``), is
the first exec's decision record; closing the acknowledgement pipe tells the front it is
written (the front stops S only after that). Then it serves the session as ``execgate run``
would (:func:`execgate.cli.run.serve_adopted`), after checking that what it computes itself
equals what the front used.

Command line (the front's; not for people)::

    PLAN_FD LISTEN_FD SNAPSHOT_FD CONTROL_FD ACK_FD SESSION_DIR TOKEN ESCALATED_TOKEN
    SESSION_ID PROGRAM REALPATH CWD -- COMMAND...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from execgate.decisionlog.argv import bounded_argv
from execgate.decisionlog.chain import ChainedFile, LogPathError
from execgate.gate import runplan


class FrontStart:
    """What the native front did before this server started (its command line). A plain
    class: dataclasses would cost this first step tens of milliseconds of imports."""

    def __init__(self, argv: list[str]) -> None:
        if len(argv) < 14 or argv[12] != "--":
            raise SystemExit("execgate: error: the server of a native start was started wrongly")
        plan_fd, self.listen_fd, self.snapshot_fd, self.control_fd, self.ack_fd = map(int, argv[:5])
        try:
            self.plan = runplan.read_fd(plan_fd)
        finally:
            os.close(plan_fd)
        self.session_dir = Path(argv[5])
        self.token, self.escalated_token, self.session_id = argv[6:9]
        self.program, self.realpath, self.cwd = argv[9:12]
        self.command = argv[13:]
        self.front_pid = os.getppid()


def first_record(start: FrontStart) -> dict[str, object]:
    """The first exec's decision record, as the slow path writes it for a program no rule
    names (``gate.session.decision_entry``: decision ``run``, source ``none``)."""
    argv, cut = bounded_argv(list(start.command))
    entry: dict[str, object] = {
        "time": round(time.time(), 6),
        "session": start.session_id,
        "front": "run",
        "kind": "exec",
        "pid": os.getpid(),
        "ppid": start.front_pid,
        "cwd": start.cwd,
        "program": start.realpath or start.program,
        "argv": argv,
    }
    if cut:
        entry["argv_cut"] = cut
    entry.update(via="session", decision="run", sandbox=start.plan.sandbox, source="none")
    return entry


def write_first_record(start: FrontStart) -> None:
    plan = start.plan
    if not plan.log:
        return  # [log] enabled = false
    try:
        chain = ChainedFile(Path(plan.log), max_bytes=plan.log_max_bytes, keep=plan.log_keep)
    except LogPathError as exc:
        print(f"execgate: warning: {exc}", file=sys.stderr)
        return
    try:
        chain.append([first_record(start)])
    except OSError as exc:
        print(f"execgate: warning: cannot write the decision log: {exc.strerror}", file=sys.stderr)
    finally:
        chain.close()


def main() -> None:
    start = FrontStart(sys.argv[1:])
    try:
        write_first_record(start)
        os.write(start.ack_fd, b"1")  # (a server that died before has said nothing)
    finally:
        os.close(start.ack_fd)  # EOF: the front may stop us from now on
    from execgate.cli import entry_with
    from execgate.cli.run import serve_adopted

    entry_with(lambda: serve_adopted(start))
