"""Fixtures shared by every test folder.

``unprivileged``: an ordinary user created by the test run, for security and sandbox tests that
must also hold for people who are not root (these machines run the tests as root). The user can
run this checkout's Python and ``execgate``: the folders on the way to them get ``o+x`` for the
duration of the run (restored afterwards), and each test gets folders the user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

USER_NAME = "egtest"


@dataclass
class UnprivilegedUser:
    """A real, unprivileged account; :meth:`run` runs a command as it (``setpriv``)."""

    name: str
    uid: int
    gid: int
    home: Path
    _dirs: list[Path] = field(default_factory=list)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment for the user: its own HOME, this checkout's Python on PATH."""
        bin_dir = os.path.dirname(sys.executable)
        return {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "EXECGATE_HOME": str(self.home / ".execgate"),
            **(extra or {}),
        }

    def argv(self, command: Sequence[str]) -> list[str]:
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
            *command,
        ]

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        input: bytes | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            self.argv(command),
            env=self.env(env),
            cwd=cwd or self.home,
            input=input,
            capture_output=True,
            timeout=timeout,
        )

    def make_dir(self, parent: Path | None = None, prefix: str = "egtest-") -> Path:
        """A fresh folder the user owns (mode 0755), removed at the end of the run."""
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
        os.chown(path, self.uid, self.gid)
        path.chmod(0o755)
        self._dirs.append(path)
        return path

    def chown_tree(self, path: Path) -> None:
        subprocess.run(["chown", "-R", f"{self.uid}:{self.gid}", str(path)], check=True)


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER_NAME)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", USER_NAME],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(USER_NAME)


def _open_the_way(targets: Sequence[str]) -> list[tuple[Path, int]]:
    """Give ``o+x`` to every folder on the way to ``targets`` (and ``o+rx`` to the targets'
    own folders); returns what to restore."""
    changed: list[tuple[Path, int]] = []
    seen: set[Path] = set()
    for target in targets:
        real = Path(os.path.realpath(target))
        for folder in [*reversed(real.parents), real]:
            if folder in seen or not folder.is_dir():
                continue
            seen.add(folder)
            mode = stat.S_IMODE(folder.stat().st_mode)
            if mode & 0o001 == 0:
                folder.chmod(mode | 0o001)
                changed.append((folder, mode))
    return changed


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[UnprivilegedUser]:
    """An ordinary user (skips when the tests do not run as root or setpriv is missing)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("needs root and setpriv to create and become an unprivileged user")
    entry = _ensure_user()
    home = Path(tempfile.mkdtemp(prefix="egtest-home-"))
    os.chown(home, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)
    here = Path(__file__).resolve().parent.parent
    restore = _open_the_way(
        [sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, str(here)]
    )
    user = UnprivilegedUser(USER_NAME, entry.pw_uid, entry.pw_gid, home)
    try:
        yield user
    finally:
        for folder, mode in restore:
            folder.chmod(mode)
        for path in [*user._dirs, home]:
            shutil.rmtree(path, ignore_errors=True)
