"""Fixtures for the policy tests: every location execgate reads is moved into a temp dir."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import execgate.cli as cli


@dataclass
class Env:
    """The isolated locations one test runs with (and the working directory)."""

    root: Path
    home: Path  # $HOME
    execgate_home: Path  # $EXECGATE_HOME
    system: Path  # $EXECGATE_SYSTEM_DIR
    codex_home: Path  # $CODEX_HOME
    codex_system: Path  # $EXECGATE_CODEX_SYSTEM_DIR
    work: Path  # the working directory

    def write(self, path: Path | str, text: str) -> Path:
        target = self.work / path if not Path(path).is_absolute() else Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        return target


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    names = ["home", "execgate_home", "system", "codex_home", "codex_system", "work"]
    dirs = {name: tmp_path / name for name in names}
    for directory in dirs.values():
        directory.mkdir()
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.setenv("EXECGATE_HOME", str(dirs["execgate_home"]))
    monkeypatch.setenv("EXECGATE_SYSTEM_DIR", str(dirs["system"]))
    monkeypatch.setenv("CODEX_HOME", str(dirs["codex_home"]))
    monkeypatch.setenv("EXECGATE_CODEX_SYSTEM_DIR", str(dirs["codex_system"]))
    monkeypatch.delenv("EXECGATE_NO_CACHE", raising=False)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.chdir(dirs["work"])
    yield Env(tmp_path, **dirs)


@dataclass
class CliResult:
    status: int
    out: str
    err: str


def run_cli(*argv: str) -> CliResult:
    """``execgate ARGV`` in-process, with only this package's command groups registered (so
    the tests do not depend on the other command groups being importable)."""
    out, err = io.StringIO(), io.StringIO()
    saved = cli.COMMAND_MODULES
    cli.COMMAND_MODULES = ["check", "rules"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(argv))
            except SystemExit as exc:  # argparse usage errors and --help
                status = exc.code if isinstance(exc.code, int) else 1
    finally:
        cli.COMMAND_MODULES = saved
    return CliResult(status, out.getvalue(), err.getvalue())


@pytest.fixture
def execgate() -> Callable[..., CliResult]:
    return run_cli


def clean_environ_for(env: Env) -> dict[str, str]:
    """An environment for child processes that matches the isolated one."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(env.home),
        "EXECGATE_HOME": str(env.execgate_home),
        "EXECGATE_SYSTEM_DIR": str(env.system),
        "CODEX_HOME": str(env.codex_home),
        "EXECGATE_CODEX_SYSTEM_DIR": str(env.codex_system),
        "LC_ALL": "C.UTF-8",
    }
