"""Fixtures for attacks from inside a gated session: a real ``execgate run``, as root or as the
unprivileged user, in each sandbox mode, with a forbidden marker program.

The marker leaves its trace inside the workspace (writable in every mode, so a marker that ran
anywhere would be seen); ``outside`` is a folder no sandbox lets a confined process write
(workspace-write modes exclude /tmp, where it lives), for witnesses of code that ran outside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

MARKER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    char path[4096];
    snprintf(path, sizeof path, "%s/ran-%s", TRACES, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { dprintf(fd, "%d\n", (int)getpid()); close(fd); }
    printf("marker ran\n");
    return 0;
}
"""

MODES = ("off", "workspace-write", "strict-exec")


@dataclass
class Attacker:
    who: str  # "root" or "user"
    base: Path
    work: Path  # the workspace (cwd of the session)
    outside: Path  # not writable from any sandbox
    bin: Path  # on PATH; holds the forbidden `marker`
    traces: Path
    env: dict[str, str]
    user: Any  # tests/conftest.py's UnprivilegedUser, or None for root
    rules: Path

    def write_rules(self, text: str) -> None:
        self.rules.write_text(textwrap.dedent(text))
        self.rules.chmod(0o644)

    def mode_options(self, mode: str) -> list[str]:
        if mode == "off":
            return ["--sandbox", "off"]
        options = ["--sandbox", "workspace-write", "--exclude-tmp"]
        if mode == "strict-exec":
            options += ["--strict-exec", "--exec-dir", str(self.bin)]
        return options

    def run(
        self,
        command: str,
        *,
        mode: str = "off",
        rules: bool = True,
        options: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[bytes]:
        """``execgate run [--rules] MODE-OPTIONS OPTIONS -- bash -c COMMAND`` as the attacker."""
        argv = [
            sys.executable, "-m", "execgate", "run",
            *(["--rules", str(self.rules)] if rules else []),
            *self.mode_options(mode), *options, "--", "bash", "-c", command,
        ]  # fmt: skip
        full_env = {**self.env, **(env or {})}
        if self.user is not None:
            return subprocess.run(
                self.user.argv(argv),
                env=full_env,
                cwd=self.work,
                capture_output=True,
                timeout=timeout,
            )
        return subprocess.run(
            argv, env=full_env, cwd=self.work, capture_output=True, timeout=timeout
        )

    def ran(self, name: str = "marker") -> bool:
        return (self.traces / f"ran-{name}").exists()

    def give(self, path: Path) -> None:
        """Hand ``path`` (a tree) to the attacker."""
        if self.user is not None:
            self.user.chown_tree(path)


def compile_marker(out: Path, traces: Path) -> None:
    source = out.with_suffix(".c")
    source.write_text(MARKER_C)
    subprocess.run(["cc", "-O1", f'-DTRACES="{traces}"', "-o", out, source], check=True)
    source.unlink()


@pytest.fixture(params=["root", "user"])
def attacker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Attacker]:
    user: Any = None
    if request.param == "user":
        user = request.getfixturevalue("unprivileged")
        base = user.make_dir()
    else:
        base = tmp_path / "attack"
        base.mkdir()
    dirs = {name: base / name for name in ("work", "outside", "bin", "home", "xhome", "xsys")}
    for path in dirs.values():
        path.mkdir()
    traces = dirs["work"] / ".traces"
    traces.mkdir()
    compile_marker(dirs["bin"] / "marker", traces)
    env = {
        "PATH": f"{dirs['bin']}:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
        ":/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        "HOME": str(dirs["home"]),
        "EXECGATE_HOME": str(dirs["xhome"]),
        "EXECGATE_SYSTEM_DIR": str(dirs["xsys"]),
        "CODEX_HOME": str(dirs["home"] / ".codex"),
        "EXECGATE_CODEX_SYSTEM_DIR": str(dirs["xsys"] / "codex"),
    }
    a = Attacker(
        who=request.param,
        base=base,
        work=dirs["work"],
        outside=dirs["outside"],
        bin=dirs["bin"],
        traces=traces,
        env=env,
        user=user,
        rules=base / "test.rules",
    )
    a.write_rules('prefix_rule(["marker"], "forbidden", justification="marker must not run")\n')
    a.give(base)
    yield a
    if user is None:
        shutil.rmtree(base, ignore_errors=True)
