"""Who may use a control channel: never a process of a gated session.

A control channel (the approvals socket of ``execgate mcp``, and any later one) answers
questions and changes policy, so the processes it gates must not reach it. Sandboxes hide the
control folder (``sandbox.guarded``); :func:`why_refused` is the check every channel makes on
each connection, which also holds with the sandbox off. From the peer's credentials
(``SO_PEERCRED``, the kernel's, not the peer's word) it refuses:

* another user (root excepted, as before);
* a process that carries the gate: ``libexecgate.so`` mapped, or ``EXECGATE_TOKEN`` set;
* a process that descends from an ``execgate-launch`` (the installed one, by file identity, or
  any process named so), walking the parents in ``/proc``;
* a process that cannot be inspected, or that is gone (or whose pid was reused) by the end of
  the check (``SO_PEERPIDFD`` pins it where the kernel has it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct

from execgate import native
from execgate.errors import ExecgateError

_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5; Python 3.11 lacks the name
_GATE_VARIABLE = b"EXECGATE_TOKEN="
_MAX_DEPTH = 4096  # a pid chain longer than this is a loop (a pid reused while we walked)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _parent(pid: int) -> int:
    """The parent pid from /proc/PID/stat (after the last ')': comm may hold anything)."""
    text = _read(f"/proc/{pid}/stat")
    return int(text[text.rindex(b")") + 2 :].split()[1])


def _launcher_identity() -> tuple[int, int] | None:
    try:
        st = os.stat(native.native_path(native.LAUNCHER))
    except (OSError, ExecgateError):
        return None
    return st.st_dev, st.st_ino


def _is_launcher(pid: int, identity: tuple[int, int] | None) -> bool:
    with contextlib.suppress(OSError):
        if _read(f"/proc/{pid}/comm").rstrip(b"\n") == native.LAUNCHER.encode()[:15]:
            return True
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return False  # another user's process (e.g. pid 1): not one of our launchers
    return identity is not None and (st.st_dev, st.st_ino) == identity


def _carries_gate(pid: int) -> bool:
    """Whether the process has the interposer loaded or the gate's token in its environment.
    OSError when it cannot be inspected."""
    maps = _read(f"/proc/{pid}/maps")
    if native.INTERPOSER.encode() in maps:
        return True
    return any(v.startswith(_GATE_VARIABLE) for v in _read(f"/proc/{pid}/environ").split(b"\0"))


def gated_process(pid: int) -> str | None:
    """Why process ``pid`` belongs to a gated session (or cannot be shown not to), or None."""
    try:
        if _carries_gate(pid):
            return "the process runs under execgate's gate"
    except OSError:
        return "the process cannot be inspected"
    identity = _launcher_identity()
    seen = 0
    current = pid
    while current > 1 and seen < _MAX_DEPTH:
        if _is_launcher(current, identity):
            return "the process belongs to a gated session"
        try:
            current = _parent(current)
        except (OSError, ValueError, IndexError):
            return "the process's ancestry cannot be read"
        seen += 1
    return None if seen < _MAX_DEPTH else "the process's ancestry cannot be read"


def why_refused(sock: socket.socket) -> str | None:
    """Why the peer of the connected Unix socket ``sock`` may not use a control channel, or
    None when it may (a process of this user, or root, outside every gated session)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return "no peer credentials"
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid not in (os.getuid(), 0):
        return "another user's process"
    if pid <= 0:
        return "the peer is in another pid namespace"
    pidfd = -1
    with contextlib.suppress(OSError):
        pidfd = struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD, 4))[0]
    try:
        reason = gated_process(pid)
        if reason is None and pidfd >= 0:
            # The pid we inspected is still the peer: it has not exited and been reused.
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except ProcessLookupError:
                return "the peer is gone"
            except OSError:
                pass
        return reason
    finally:
        if pidfd >= 0:
            os.close(pidfd)
