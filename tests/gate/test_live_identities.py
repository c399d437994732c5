"""The live policy's alias table follows the files at their rule-named paths (inotify)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from execgate.gate import livepolicy
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.snapshot import Snapshot, build_snapshot
from execgate.policy import load_rules_files


def test_a_file_replaced_at_its_path_gets_its_new_identity(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    program = tools / "forbidden"
    shutil.copy("/bin/true", program)
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["forbidden"], "forbidden")\n')
    live = LivePolicy(load_rules_files([rules]), search_path=str(tools))
    published: list[bytes] = []
    live.subscribe(published.append)
    old = os.stat(program)
    assert live.current_aliases()[(old.st_dev, old.st_ino)] == ("forbidden",)
    assert published == []  # nothing changed: nothing republished

    shutil.copy("/bin/true", tools / "new")
    os.replace(tools / "new", program)  # no event loop runs: the drain alone must see it
    new = os.stat(program)
    aliases = live.current_aliases()
    assert aliases[(new.st_dev, new.st_ino)] == ("forbidden",)
    assert (old.st_dev, old.st_ino) not in aliases
    assert published == [live.snapshot]

    unrelated = tools / "unrelated.txt"
    unrelated.write_text("x")
    before = live.current_aliases()
    assert live.current_aliases() is before and published == [live.snapshot]


def _linked_program(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``tools/forbidden`` a symlink to ``elsewhere/real`` (a folder no rule names)."""
    tools, elsewhere = tmp_path / "tools", tmp_path / "elsewhere"
    tools.mkdir()
    elsewhere.mkdir()
    target = elsewhere / "real"
    shutil.copy("/bin/true", target)
    (tools / "forbidden").symlink_to(target)
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["forbidden"], "forbidden")\n')
    return tools, target, rules


def _replace(target: Path) -> tuple[int, int]:
    shutil.copy("/bin/false", target.with_name("new"))
    os.replace(target.with_name("new"), target)
    st = os.stat(target)
    return (st.st_dev, st.st_ino)


def test_the_target_of_a_link_is_followed_in_its_own_folder(tmp_path: Path) -> None:
    tools, target, rules = _linked_program(tmp_path)
    live = LivePolicy(load_rules_files([rules]), search_path=str(tools))
    new = _replace(target)  # in the link's target folder, not the rule-named one
    assert live.current_aliases()[new] == ("forbidden",)


def test_a_target_replaced_before_its_folder_was_watched_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link's target folder is found by the build, so it is watched only after it: a
    replacement in between (made here right after the first build) must not leave the table
    with the old identity."""
    tools, target, rules = _linked_program(tmp_path)
    builds: list[int] = []

    def build_then_replace(*args: Any, **kwargs: Any) -> Snapshot:
        snapshot = build_snapshot(*args, **kwargs)
        builds.append(1)
        if len(builds) == 1:
            _replace(target)
        return snapshot

    monkeypatch.setattr(livepolicy, "build_snapshot", build_then_replace)
    live = LivePolicy(load_rules_files([rules]), search_path=str(tools))
    st = os.stat(target)
    assert live.aliases.get((st.st_dev, st.st_ino)) == ("forbidden",)
    assert len(builds) == 2
