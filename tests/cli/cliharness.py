"""Helpers for the command-line tests: the real ``execgate`` run as a program, every location
it reads moved into a temp dir (``World``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EXECGATE = [sys.executable, "-m", "execgate"]


@dataclass
class World:
    """The isolated locations one test runs with (and its working directory)."""

    home: Path  # $HOME
    execgate_home: Path  # $EXECGATE_HOME
    codex_home: Path  # $CODEX_HOME
    work: Path  # the working directory

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("EXECGATE_", "CODEX_", "XDG_")) and key != "NO_COLOR"
        }
        env.update(
            HOME=str(self.home),
            EXECGATE_HOME=str(self.execgate_home),
            CODEX_HOME=str(self.codex_home),
            LANG="C.UTF-8",
        )
        env.update(extra or {})
        return env

    def run(
        self,
        *argv: str | bytes,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        input: bytes | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """``execgate ARGV`` (output decoded, undecodable bytes escaped)."""
        return _decoded(
            subprocess.run(
                [*EXECGATE, *argv],
                env=self.env(env),
                cwd=cwd or self.work,
                input=input,
                capture_output=True,
                timeout=timeout,
            )
        )


def _decoded(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode("utf-8", "backslashreplace"),
        done.stderr.decode("utf-8", "backslashreplace"),
    )


def one_error(done: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The single ``execgate: error: …`` line a failed command printed (asserts its shape)."""
    lines = done.stderr.splitlines()
    assert done.returncode == status, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("execgate: error: "), lines[0]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    return lines[0]
