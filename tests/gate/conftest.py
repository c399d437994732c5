"""Fixtures for end-to-end tests of the gate: real `execgate run`, real shells, real server."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from execgate.paths import control_dir

EXECGATE = [sys.executable, "-m", "execgate"]


@dataclass
class Gate:
    """A sandbox of a machine for one test: isolated homes, a rules file, marker programs."""

    root: Path
    env: dict[str, str]
    rules: Path
    bin: Path
    traces: Path  # where marker programs leave a file when they run
    tag: str  # unique per test, to find this test's processes

    def write_rules(self, text: str) -> Path:
        self.rules.write_text(textwrap.dedent(text))
        return self.rules

    def run(
        self,
        command: Sequence[str] | str,
        *,
        rules: bool = True,
        options: Sequence[str] = (),
        input: bytes | None = None,
        cwd: Path | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """``execgate run [--rules RULES] OPTIONS -- command`` (a string means ``bash -c``)."""
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        cmd = [*EXECGATE, "run", *(["--rules", str(self.rules)] if rules else []), *options]
        return subprocess.run(
            [*cmd, "--", *argv],
            env={**self.env, **(env or {})},
            cwd=cwd or self.root,
            input=input,
            capture_output=True,
            timeout=timeout,
        )

    def ran(self, name: str = "marker") -> bool:
        """Whether the marker program called ``name`` ran (under any path)."""
        return (self.traces / f"ran-{name}").exists()

    def leftovers(self) -> list[str]:
        """Processes whose command line carries this test's tag."""
        found = subprocess.run(["pgrep", "-af", self.tag], capture_output=True, text=True)
        return [line for line in found.stdout.splitlines() if "pgrep" not in line]


MARKER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
/* Leaves a trace file named after how it was called, then prints its argv. */
int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    char path[4096];
    snprintf(path, sizeof path, "%s/ran-%s", MARKER_DIR, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { dprintf(fd, "%d\n", (int)getpid()); close(fd); }
    for (int i = 1; i < argc; i++) printf("%s%s", i > 1 ? " " : "", argv[i]);
    printf("\n");
    return 0;
}
"""


@pytest.fixture(scope="session")
def marker_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compiled marker program (an ELF, so the dynamic-loader trick can be tried on it)."""
    build = tmp_path_factory.mktemp("marker")
    source = build / "marker.c"
    source.write_text(MARKER_C)
    out = build / "marker"
    marker_dir = build / "traces"
    marker_dir.mkdir()
    subprocess.run(["cc", "-O1", f'-DMARKER_DIR="{marker_dir}"', "-o", out, source], check=True)
    return out


@pytest.fixture
def gate(tmp_path: Path, marker_binary: Path) -> Iterator[Gate]:
    root = tmp_path / "work"
    root.mkdir()
    homes = {
        "HOME": tmp_path / "home",
        "EXECGATE_HOME": tmp_path / "execgate-home",
        "EXECGATE_SYSTEM_DIR": tmp_path / "etc-execgate",
        "CODEX_HOME": tmp_path / "codex-home",
        "EXECGATE_CODEX_SYSTEM_DIR": tmp_path / "etc-codex",
    }
    for path in homes.values():
        path.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    traces = marker_binary.parent / "traces"
    for stale in traces.iterdir():
        stale.unlink()
    for name in ("marker", "other"):
        shutil.copy(marker_binary, bin_dir / name)
    # Another program than marker (a copy is judged as the program it copies): one more byte
    # after the ELF's last section changes nothing it does.
    with (bin_dir / "other").open("ab") as other:
        other.write(b"\0")
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        **{k: str(v) for k, v in homes.items()},
    }
    g = Gate(
        root=root,
        env=env,
        rules=tmp_path / "test.rules",
        bin=bin_dir,
        traces=traces,
        tag=f"egtag{uuid.uuid4().hex[:12]}",
    )
    g.write_rules('prefix_rule(["marker"], "forbidden", justification="marker must not run")\n')
    yield g
    for line in g.leftovers():
        pid = int(line.split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    # A long tmp_path puts the control folder sessions create in /tmp: remove it when empty.
    with mock.patch.dict(os.environ, env, clear=True):
        control = control_dir()
    if tmp_path not in control.parents:
        with contextlib.suppress(OSError):
            control.rmdir()
