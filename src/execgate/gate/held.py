"""A session's shell started ahead of its call (docs/protocol.md §7 "Held spawns").

Most of a shell's start is the kernel's exec, the dynamic loader and libc's start-up (on a VM,
where each CPUID traps, more than two thirds of ``bash -c true``), none of which depends on the
call. A spare session starts its shell right away, with a placeholder command and environment
at least as long as a call's; the interposer holds it before the shell's own code runs
(native/hold.h). The call then costs a ``release``: the call's arguments, environment,
working directory and descriptors, written over the placeholder's.

The shell is judged when the call comes, as any session's command (the descriptor it was
exec'd from is the one opened here). A call it does not fit (another shell, a longer command
than the room left for it, loader variables other than the ones it was started with, another
sandbox, a process group or terminal of its own) kills it, and the session spawns the judged
file as usual; so does a change since it was started of the policy's snapshot or contents, or
of what its sandbox was set up from (a writable root, a protected name in one, a read-only or
hidden path: a `.git` made since must be read-only in the call's sandbox).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from execgate.gate.content import ContentIndex
from execgate.gate.launcher import LaunchedProcess
from execgate.gate.program import GatedExec

#: Room for the call's command (bytes). A longer one is spawned as usual.
COMMAND_ROOM = 32 << 10
#: Room for what the call's environment has beyond the placeholder's (a longer working
#: directory, an escalated token, …).
ENVIRONMENT_ROOM = 16 << 10
#: What the interposer looks for (hold.h); never passed on by a gated exec.
HOLD_VARIABLE = b"EXECGATE_HOLD=3"
#: The number the hold socket has in the held shell: a call cannot name it.
HOLD_FD = 3
#: Read by the loader or libc before the interposer's constructor: a call must bring the same.
_BEFORE_MAIN = (b"LD_", b"GLIBC_TUNABLES=", b"MALLOC_")


def placeholder_argv(shell: bytes) -> list[bytes]:
    return [shell, b"-c", b" " * COMMAND_ROOM]


def placeholder_env(env: Sequence[bytes]) -> list[bytes]:
    """``env`` (a call's, as the session makes it) with the hold asked for and room to grow."""
    return [*env, HOLD_VARIABLE, b"EXECGATE_HOLD_ROOM=" + b"x" * ENVIRONMENT_ROOM]


def _size(strings: Sequence[bytes]) -> int:
    return sum(len(s) + 1 for s in strings)


def _before_main(env: Sequence[bytes]) -> list[bytes]:
    return sorted(e for e in env if e.startswith(_BEFORE_MAIN))


@dataclass
class HeldShell:
    """A held shell of a session: the process, what was judged, what it can take."""

    process: LaunchedProcess
    exec_: GatedExec  # the shell as opened for it (placeholder argv and cwd)
    judged: tuple[int, ...]  # the descriptors opened for it (ours to close): it runs the last
    contents: ContentIndex  # the content index it was opened with
    snapshot: bytes  # the policy snapshot then (a new one may cover other programs)
    layout: tuple[object, ...]  # what its sandbox was set up from (SandboxSpec.layout_now)
    argv: list[bytes]
    env: list[bytes]
    sandboxed: bool

    def still_current(
        self, contents: ContentIndex, snapshot: bytes, layout: tuple[object, ...]
    ) -> bool:
        """Was it started under what holds now: the policy's contents and snapshot, and a
        file system its sandbox would be set up from the same way (a `.git` made since in a
        writable root is read-only only in a sandbox set up after it)?"""
        return contents is self.contents and snapshot is self.snapshot and layout == self.layout

    def kill(self) -> None:
        """End it (it is not the session's last program until released: the launcher goes
        on)."""
        self.process.signal(signal.SIGKILL)

    def discard(self) -> None:
        """End it, and close what was opened for it (no call will judge it)."""
        self.kill()
        for fd in self.judged:
            os.close(fd)

    def fits(
        self,
        argv: Sequence[bytes],
        env: Sequence[bytes],
        fds: Collection[int],
        *,
        sandboxed: bool,
        pgid: int,
    ) -> bool:
        """Can this call be released into the held shell?"""
        return (
            self.process.returncode is None
            and sandboxed == self.sandboxed
            and pgid == -1
            and HOLD_FD not in fds
            and len(argv) == len(self.argv)
            and argv[0] == self.argv[0]
            and _size(argv) <= _size(self.argv)
            and _size(env) <= _size(self.env)
            and _before_main(env) == _before_main(self.env)
        )
