"""Helpers for the native-side tests: a gate (stand-in server + the environment that puts
programs under it) and small program makers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .gateserver import GateServer, deny_names


class Gate:
    """A gate server plus the environment that puts programs under it.

    work/bin (first on PATH) holds `forbidden` (denied by the default rule; running it creates
    work/FORBIDDEN_RAN) and `allowed` (prints its arguments)."""

    def __init__(self, server: GateServer, native: dict[str, Path], work: Path) -> None:
        self.server = server
        self.native = native
        self.work = work
        self.bin = work / "bin"
        self.bin.mkdir()
        self.ran = work / "FORBIDDEN_RAN"
        marker(self.bin, "forbidden", f'echo "$0 $*" >> {self.ran}; echo forbidden ran')
        marker(self.bin, "allowed", 'echo "allowed:$*"')
        self.env = server.env(native["wrapper"], native["preload"])
        self.env["PATH"] = f"{self.bin}:/usr/local/bin:/usr/bin:/bin"
        self.env["LC_ALL"] = "C"  # the shells' own messages in English
        server.rule = deny_names("forbidden")
        server.ask_always()

    def forbidden_ran(self) -> bool:
        return self.ran.exists()

    def run(
        self,
        args: list[str] | str,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        **kw: object,
    ) -> subprocess.CompletedProcess[bytes]:
        kw.setdefault("cwd", self.work)
        kw.setdefault("capture_output", True)
        return subprocess.run(args, env=self.env if env is None else env, timeout=timeout, **kw)  # type: ignore[call-overload]

    def sh(
        self, script: str, shell: str = "bash", **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        return self.run([shell, "-c", script], **kw)


def marker(directory: Path, name: str, body: str = 'echo "$0 ran: $*"') -> Path:
    """An executable shell script (a program the rules can name)."""
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def copy_binary(src: str, dst: Path) -> Path:
    shutil.copy2(src, dst)
    dst.chmod(0o755)
    return dst
