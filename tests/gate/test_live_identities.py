"""The live policy's alias table follows the files at their rule-named paths (inotify)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from execgate.gate.livepolicy import LivePolicy
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
