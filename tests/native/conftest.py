"""Fixtures for the native-side tests: the compiled interposer and wrapper, a stand-in gate
server (gateserver.py), helpers to run real programs gated, and C test programs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .gateserver import GateServer
from .support import Gate

HERE = Path(__file__).resolve().parent

REPO = HERE.parent.parent
BIN = REPO / "src" / "execgate" / "_bin"


@pytest.fixture(scope="session")
def native() -> dict[str, Path]:
    """Build (if stale) and return the native programs."""
    subprocess.run(
        [sys.executable, str(REPO / "native" / "build.py"), str(BIN)],
        check=True,
        capture_output=True,
    )
    return {"preload": BIN / "libexecgate.so", "wrapper": BIN / "execgate-wrapper"}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory (Unix socket paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="egt", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gate(native: dict[str, Path], short_tmp: Path) -> Iterator[Gate]:
    server = GateServer(short_tmp / "session")
    work = short_tmp / "work"
    work.mkdir()
    try:
        yield Gate(server, native, work)
    finally:
        server.close()
    assert not server.errors, server.errors


@pytest.fixture(scope="session")
def cprog(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Compile tests/native/c/NAME.c once per session; returns a function NAME -> path."""
    out = tmp_path_factory.mktemp("cbin")
    built: dict[str, Path] = {}

    def get(name: str, *extra: str) -> Path:
        if name not in built:
            exe = out / name
            subprocess.run(
                [
                    "gcc",
                    "-std=gnu11",
                    "-O1",
                    "-Wall",
                    "-pthread",
                    "-o",
                    str(exe),
                    str(HERE / "c" / f"{name}.c"),
                    *extra,
                ],
                check=True,
            )
            built[name] = exe
        return built[name]

    return get
