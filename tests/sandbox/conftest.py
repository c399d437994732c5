"""Fixtures for the sandbox tests: native programs built, directories inside and outside the
writable roots (outside means not under /tmp either, which workspace-write makes writable)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher"))

from egtest_launch import build_native

from execgate.sandbox import SandboxSupport, probe

# Not below /tmp (a writable root by default) and on a disk filesystem.
SCRATCH_PARENT = Path("/var/tmp")


@pytest.fixture(scope="session", autouse=True)
def _native_built() -> None:
    build_native()


@pytest.fixture(scope="session")
def support() -> SandboxSupport:
    """Skip only for what the kernel lacks; a filter of ours that misbehaves must fail."""
    found = probe()
    kernel_lacks_seccomp = not found.seccomp and "cannot install" in (found.seccomp_error or "")
    if found.landlock_abi < 3 or found.seccomp_arch is None or kernel_lacks_seccomp:
        pytest.skip(f"this kernel cannot enforce the sandbox: {found}")
    return found


def _scratch(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=SCRATCH_PARENT)).resolve()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def workspace(support: SandboxSupport) -> Iterator[Path]:
    """The session's working directory (a writable root under workspace-write)."""
    yield from _scratch("egws-")


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory no profile makes writable."""
    yield from _scratch("egout-")
