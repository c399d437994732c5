"""Standing authorizations: a repeated escalation claimed at the launcher without the server.

A loop escalates the same command over and over, and each time the server derives the same
facts and reaches the same kept action (gate/escalation.py ``JudgementCache``). Once it has
escalated such an exec, the session may tell the launcher that claims of exactly that exec need
not ask it (docs/protocol.md §7 ``standing``): the interposer then claims it directly, and the
launcher grants the claim only when every fact the server judged is byte-equal to what the
launcher derives itself from the claimer and the file at that moment (§4 "Standing claims"), runs
its own descriptor of the judged file, and reports the claim (``stood``) so the decision log
still has one record per escalation.

The reports come on a socket of their own (§7 ``standing``), which the session reads in
batches: a loop of standing claims wakes it at most once per :data:`REPORT_PAUSE` (a claim it
would otherwise answer itself costs the server a wake-up and ~0.3 ms of Python each), and
:meth:`Standing.drain` reads what is there whenever records must be complete (a call's
answer, the session's end). A report is in the socket before the program starts, so a
launcher that dies afterwards loses none.

Offered only for what nothing but those facts decides: a program (no ``#!`` chain, not the
loader) that does not leave the gate, escalated by a kept action (an ``allow`` rule naming it
by a bare name: no human, no approval, no skill script; not an interpreter that could be given
a skill script), asked with the session's own token
from inside the sandbox through the stand-in that covers it there (docs/protocol.md §5: the
claimer's descriptor must be that stand-in, which no sandboxed process can forge), whose file
had not changed for a second when the server looked at it (so any later change moves its
``ctime``, which the launcher compares). Everything a judgement
also depends on (policy, aliases, contents, skill folders, approvals) revokes them all first
(:meth:`Standing.revoke`, called by the live policy before it changes and by the session).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from execgate.gate.escalation import Action
from execgate.gate.identity import ExecFile, FileId
from execgate.gate.launcher import Launcher, LauncherError
from execgate.gate.program import GatedExec
from execgate.gate.protocol import (
    EnvRules,
    ExecRequest,
    ProtocolError,
    Stood,
    encode_standing,
    parse_stood,
)
from execgate.gate.skills import INTERPRETERS, interpreter_name

log = logging.getLogger("execgate.gate")

#: The ``via`` of a standing claim's record (the decision log, the escalations log).
STANDING_VIA = "standing"
#: Standing authorizations at once (the launcher keeps as many, native/launch.c MAX_STANDING).
LIMIT = 64
#: The largest standing message offered (a huge argv is escalated the usual way).
MAX_FRAME = 64 << 10
#: Claims the session can still log after their authorization was replaced or revoked.
LOGGED = 256
#: A file whose ctime is younger than this may still change within the same clock tick.
_SETTLED_NS = 1_000_000_000
#: Seconds between two readings of the claims' reports at most (the reports wait meanwhile).
REPORT_PAUSE = 0.05
#: A report's size at most (native/launch.c: an ID of up to 255 bytes and two numbers).
_REPORT_SIZE = 512


def _may_run_a_script(exec_: GatedExec) -> bool:
    """Whether ``exec_`` is an interpreter that may be given a script (``bash tool.sh``): the
    server looks for skill scripts among them on every exec (gate/skills.py), by a path that
    depends on files nothing watches (a symlink ``tool.sh`` made in the workspace), so such
    execs are never standing."""
    names = (exec_.realpath, exec_.path, *exec_.argv[:1])
    return any(interpreter_name(name) in INTERPRETERS for name in names)


@dataclass(frozen=True, slots=True)
class Granted:
    """What a standing authorization was made from: the decision log's record of each claim."""

    exec: GatedExec
    action: Action


#: Called for each claim the launcher reported, with what its authorization was made from
#: (None: an id this session no longer knows, or never gave).
OnClaim = Callable[[Stood, Granted | None], None]


class Standing:
    """The standing authorizations of one session's launcher, and the reports of their claims
    (to ``on_claim``). Made on the event loop; :meth:`close` it with the session."""

    def __init__(
        self, launcher: Launcher, token: str, watch_fd: int | None, on_claim: OnClaim
    ) -> None:
        self._launcher = launcher
        self._token = token.encode()
        self._watch_fd = watch_fd
        self._on_claim = on_claim
        self._ids = 0
        self._offered: dict[tuple[object, ...], int] = {}  # exec's facts -> id
        self._granted: OrderedDict[int, Granted] = OrderedDict()  # id -> what it logs
        # Datagrams: a report is whole or not there (the launcher never sends half of one).
        self._reports, self._report_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._reports.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._paused: asyncio.TimerHandle | None = None
        self._loop.add_reader(self._reports.fileno(), self._readable)

    def offer(
        self,
        exec_: GatedExec,
        request: ExecRequest,
        program: ExecFile,
        runs: int,
        action: Action,
        env: EnvRules,
        standin: tuple[FileId, str],
    ) -> bool:
        """Let the launcher take claims of exactly ``exec_`` (escalated as ``action`` with the
        descriptor ``runs``) when it qualifies (see the module's docstring). ``standin``: the
        stand-in the request came through and the path of the program it covers (opened by
        that path: the launcher opens it again the same way). Whether one is standing now."""
        judged = program.judged
        if (
            standin[1] != exec_.realpath
            or self._watch_fd is None
            or judged is None
            or request.token != self._token
            or exec_.interpreters
            or exec_.runs_loader
            or exec_.leaves_gate is not None
            or _may_run_a_script(exec_)
            or not exec_.realpath
            or not exec_.path.startswith("/")
            or not exec_.cwd.startswith("/")
            or request.path != exec_.path.encode("utf-8", "surrogateescape")
            or judged.ctime_ns > time.time_ns() - _SETTLED_NS
        ):
            return False
        standin_id = standin[0]
        key = (exec_.path, exec_.realpath, exec_.cwd, exec_.argv, judged, standin_id)
        if key in self._offered:
            return True
        self._ids += 1
        try:
            frame = encode_standing(
                self._ids,
                token=self._token,
                display=exec_.display(),
                path=request.path,
                realpath=exec_.realpath.encode("utf-8", "surrogateescape"),
                cwd=exec_.cwd.encode("utf-8", "surrogateescape"),
                judged=judged,
                standin=standin_id,
                argv=request.argv,
                env=env,
            )
            if len(frame) > MAX_FRAME:
                return False
            self._launcher.stand(frame, runs, self._watch_fd, self._report_end.fileno())
        except (LauncherError, ProtocolError):
            return False
        if len(self._offered) >= LIMIT:  # the launcher let its oldest go too
            del self._offered[next(iter(self._offered))]
        self._offered[key] = self._ids
        self._granted[self._ids] = Granted(exec_, action)
        while len(self._granted) > LOGGED:
            self._granted.popitem(last=False)
        return True

    def revoke(self) -> None:
        """Every standing authorization goes, before this returns (written to the launcher)."""
        if self._offered:
            self._offered.clear()
            self._launcher.revoke()

    # -- the claims' reports --------------------------------------------------------------

    def drain(self) -> None:
        """Hand every claim reported so far to ``on_claim``, without waiting."""
        while True:
            try:
                datagram = self._reports.recv(_REPORT_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # closed (drain after close)
                return
            try:
                stood = parse_stood(datagram)
            except ProtocolError as exc:
                log.warning("gate: a malformed report of a standing claim: %s", exc)
                continue
            self._on_claim(stood, self._granted.get(stood.standing_id))

    def _readable(self) -> None:
        self.drain()
        # At most one wake-up per pause: reports of the claims meanwhile wait in the socket.
        self._loop.remove_reader(self._reports.fileno())
        self._paused = self._loop.call_later(REPORT_PAUSE, self._resume)

    def _resume(self) -> None:
        self._paused = None
        self._loop.add_reader(self._reports.fileno(), self._readable)

    def close(self) -> None:
        """Read the last reports, then stop (the launcher is gone or no longer claims).
        Idempotent."""
        if self._reports.fileno() < 0:
            return
        self.drain()
        if self._paused is not None:
            self._paused.cancel()
        else:
            self._loop.remove_reader(self._reports.fileno())
        self._reports.close()
        self._report_end.close()
