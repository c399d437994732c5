"""Fixtures for the launcher tests: the freshly built native programs, helpers on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from egtest_launch import build_native


@pytest.fixture(scope="session", autouse=True)
def _native_built() -> None:
    build_native()
