"""The server as the subreaper of last resort: what a dead launcher leaves behind dies too.

Each session's ``execgate-launch`` is a child subreaper that kills its whole tree when the
session ends. A gated process of the same user (sandbox off) can kill the launcher itself; its
descendants would then be reparented to init and outlive the session. A front end
(``execgate run``, ``execgate mcp``) therefore makes its own process a child subreaper too
(:func:`adopt_orphans`): those descendants are reparented to the server instead, and when a
launcher has exited, :func:`kill_adopted` kills and reaps every process the server adopted.

The only children the server starts itself are launchers (registered with :func:`own` while
they run) and short synchronous probes (which never overlap a sweep: both run on the event
loop's thread). Every other child is an adopted orphan. Killing goes through a pidfd opened
while the process is our unreaped child, so a reused pid is never signalled. A cgroup would be
stronger (it also survives a killed server) but an ordinary user usually cannot create one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal

_PR_SET_CHILD_SUBREAPER = 36
_enabled = False
_own: set[int] = set()
# Each round kills one generation (children of killed processes are adopted in turn).
_MAX_ROUNDS = 64
_EXIT_WAIT = 5.0


def adopt_orphans() -> bool:
    """Make this process a child subreaper (front ends only: in a process that starts other
    children of its own, :func:`kill_adopted` would kill them). False if the kernel refused."""
    global _enabled
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return False
    _enabled = True
    return True


def own(pid: int) -> None:
    """``pid`` is a child we started (a launcher): never an orphan to kill."""
    _own.add(pid)


def disown(pid: int) -> None:
    _own.discard(pid)


def _parent_of(pid: str) -> int:
    """The parent pid in ``/proc/PID/stat`` (-1 if the process is gone): raw reads, as a
    sweep reads one per process on the machine."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        stat = os.read(fd, 1024)
    except OSError:
        return -1
    finally:
        os.close(fd)
    fields = stat[stat.rfind(b")") + 2 :].split(None, 2)
    return int(fields[1]) if len(fields) > 1 else -1


def _children() -> list[int]:
    """Our children (live or zombie), from ``/proc`` (``/proc/PID/task/*/children`` needs
    CONFIG_PROC_CHILDREN, which not every kernel has)."""
    me = os.getpid()
    return [
        int(entry.name)
        for entry in os.scandir("/proc")
        if entry.name.isdigit() and _parent_of(entry.name) == me
    ]


def _is_child(pid: int) -> bool:
    return _parent_of(str(pid)) == os.getpid()


async def kill_adopted() -> int:
    """Kill and reap every process this server adopted; returns how many. A no-op unless
    :func:`adopt_orphans` made this process a subreaper."""
    if not _enabled:
        return 0
    killed = 0
    for _ in range(_MAX_ROUNDS):
        orphans = [pid for pid in _children() if pid not in _own]
        if not orphans:
            break
        pidfds = []
        for pid in orphans:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            # Still our child after the pidfd is open: the pidfd names this very process
            # (only we reap our children, so the pid cannot have been reused before).
            if pid in _own or not _is_child(pid):
                os.close(pidfd)
                continue
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            pidfds.append(pidfd)
            killed += 1
        for pidfd in pidfds:
            try:
                await _exited(pidfd)
                with contextlib.suppress(ChildProcessError):
                    os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
            finally:
                os.close(pidfd)
    return killed


async def _exited(pidfd: int) -> None:
    """Until the process behind ``pidfd`` has exited (bounded: a process stuck in the kernel
    stays a zombie child of ours until the next sweep)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await asyncio.wait_for(done, _EXIT_WAIT)
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(pidfd)
