"""Standing authorizations: a repeated escalation claimed at the launcher without the server.

A loop escalates the same command over and over, and each time the server derives the same
facts and reaches the same kept action (gate/escalation.py ``JudgementCache``). Once it has
escalated such an exec, the session may tell the launcher that claims of exactly that exec need
not ask it (docs/protocol.md §7 ``standing``): the interposer then claims it directly, and the
launcher grants the claim only when every fact the server judged is byte-equal to what the
launcher derives itself from the claimer and the file at that moment (§4 "Standing claims"), runs
its own descriptor of the judged file, and reports the claim (``stood``) so the decision log
still has one record per escalation.

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

import time
from collections import OrderedDict
from dataclasses import dataclass

from execgate.gate.escalation import Action
from execgate.gate.identity import ExecFile, FileId
from execgate.gate.launcher import Launcher, LauncherError
from execgate.gate.program import GatedExec
from execgate.gate.protocol import EnvRules, ExecRequest, ProtocolError, encode_standing
from execgate.gate.skills import INTERPRETERS, interpreter_name

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


class Standing:
    """The standing authorizations of one session's launcher."""

    def __init__(self, launcher: Launcher, token: str, watch_fd: int | None) -> None:
        self._launcher = launcher
        self._token = token.encode()
        self._watch_fd = watch_fd
        self._ids = 0
        self._offered: dict[tuple[object, ...], int] = {}  # exec's facts -> id
        self._granted: OrderedDict[int, Granted] = OrderedDict()  # id -> what it logs

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
            self._launcher.stand(frame, runs, self._watch_fd)
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

    def claimed(self, standing_id: int) -> Granted | None:
        """What the standing authorization a launcher reported a claim of was made from."""
        return self._granted.get(standing_id)
