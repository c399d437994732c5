"""The manifest check every session makes (execgate/native.py), within one long-lived server:
once the native files were found intact, an unchanged installation costs four stats, and any
change to a file or to the manifest since is caught by the next session, not only at start-up."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from execgate import native
from execgate.errors import ExecgateError


@pytest.fixture
def copied_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the installed ``_bin`` that this process's check reads instead."""
    folder = tmp_path / "_bin"
    shutil.copytree(native.bin_dir(), folder)
    monkeypatch.setattr(native, "bin_dir", lambda: folder)
    monkeypatch.setattr(native, "_digests", {})
    monkeypatch.setattr(native, "_intact", set())
    return folder


def _refused(why: str) -> None:
    with pytest.raises(ExecgateError, match=why):
        native.verify_installation()


def test_a_file_changed_after_an_intact_check_is_refused(copied_bin: Path) -> None:
    native.verify_installation()
    native.verify_installation()  # as found: passes again
    launcher = copied_bin / native.LAUNCHER
    original = launcher.read_bytes()
    with launcher.open("r+b") as f:  # same size, same inode: only ctime (and mtime) move
        f.write(b"X")
    _refused("not the one that was installed")
    launcher.write_bytes(original)  # the installed bytes again: intact again
    native.verify_installation()


def test_a_replaced_manifest_is_read_again(copied_bin: Path) -> None:
    native.verify_installation()
    manifest = copied_bin / native.MANIFEST
    text = manifest.read_text()
    wrong = text.replace(json.loads(text)["sha256"][native.WRAPPER], "0" * 64)
    assert wrong != text
    replacement = copied_bin / "manifest.new"
    replacement.write_text(wrong)
    os.replace(replacement, manifest)
    _refused("not the one that was installed")


def test_a_file_swapped_for_a_symlink_is_refused(copied_bin: Path) -> None:
    native.verify_installation()
    interposer = copied_bin / native.INTERPOSER
    moved = copied_bin / "elsewhere.so"
    os.replace(interposer, moved)
    interposer.symlink_to(moved)  # the same bytes, reached through a link
    _refused("Too many levels of symbolic links")  # O_NOFOLLOW: never followed
