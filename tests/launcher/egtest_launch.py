"""Helpers shared by the launcher and sandbox tests: run real programs through a real
``execgate-launch`` and collect their status and output (through a file, so nothing can block
on a full pipe)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from execgate.gate.launcher import Launcher
from execgate.sandbox import SandboxSpec

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "src" / "execgate" / "_bin"
LAUNCH = BIN / "execgate-launch"

# A system Python for snippets run inside sandboxes (strict-exec allows /usr only).
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    "LANG": "C",
    "HOME": "/nonexistent",
}
TIMEOUT = 60.0

T = TypeVar("T")


def build_native() -> None:
    subprocess.run(
        [sys.executable, str(REPO / "native" / "build.py"), str(BIN)],
        check=True,
        capture_output=True,
    )


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run an async scenario with an overall timeout (a hang fails, it does not stall)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), TIMEOUT)

    return asyncio.run(bounded())


def env_list(env: Mapping[str, str] | None = None, **extra: str) -> list[bytes]:
    merged = dict(ENV if env is None else env)
    merged.update(extra)
    return [f"{k}={v}".encode() for k, v in merged.items()]


@dataclass
class Result:
    status: int  # raw wait status
    output: str

    @property
    def code(self) -> int:
        """Exit code, or -SIGNUM for a signal death."""
        return os.waitstatus_to_exitcode(self.status)

    def __str__(self) -> str:
        return f"status {self.code}: {self.output!r}"


async def run_in(
    launcher: Launcher,
    argv: Sequence[str],
    *,
    cwd: str | Path = "/",
    sandboxed: bool = True,
    env: Mapping[str, str] | None = None,
    fds: Mapping[int, int] | None = None,
    pgid: int = -1,
) -> Result:
    """Spawn argv through the launcher with stdout+stderr to a file; wait; return both."""
    with tempfile.TemporaryFile() as out, open(os.devnull, "rb") as null:
        placed = {0: null.fileno(), 1: out.fileno(), 2: out.fileno()}
        placed.update(fds or {})
        process = await launcher.spawn(
            path=os.fsencode(shutil.which(argv[0], path=ENV["PATH"]) or argv[0]),
            argv=[os.fsencode(a) for a in argv],
            env=env_list(env),
            cwd=os.fsencode(cwd),
            fds=placed,
            sandboxed=sandboxed,
            pgid=pgid,
        )
        status = await process.wait()
        out.seek(0)
        return Result(status, out.read().decode(errors="replace"))


async def sh(launcher: Launcher, script: str, **kw: object) -> Result:
    return await run_in(launcher, ["/bin/bash", "-c", script], **kw)  # type: ignore[arg-type]


def sandboxed(spec: SandboxSpec | None, script: str, **kw: object) -> Result:
    """One bash script in a fresh launcher with ``spec``; the launcher is shut down after."""

    async def go() -> Result:
        launcher = await Launcher.start(spec, new_session=True)
        try:
            return await sh(launcher, script, **kw)
        finally:
            await launcher.shutdown()

    return run(go)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_quietly(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
