"""Issue 9 item 5 (hard links): a file's identity follows the file at its path.

The policy snapshot and alias table record the ``(dev, ino)`` of each rule-named file, so a hard
link under another name is judged as the program it is. The attack replaces the forbidden file
at its path with a new one (a new inode the tables never saw), hard-links that under another
name and runs the link, at once and over and over. The folders of rule-named files are
watched and drained before every judgement, and a hard-linked file always reaches the server,
so the link is denied every time, whatever the timing.
"""

from __future__ import annotations

import pytest

from .conftest import MODES, Attacker

ATTEMPTS = 50


@pytest.mark.parametrize("mode", MODES)
def test_a_hard_link_made_after_a_replacement_is_the_forbidden_program(
    attacker: Attacker, mode: str
) -> None:
    tools = attacker.work / "tools"
    tools.mkdir()
    (attacker.bin / "marker").rename(tools / "marker")
    attacker.give(tools)
    env = {"PATH": f"{tools}:{attacker.env['PATH']}"}
    attack = (
        f"cd {tools}\n"
        f"for i in $(seq {ATTEMPTS}); do\n"
        "  cp marker marker.new && mv -f marker.new marker\n"  # a new inode at the path
        '  ln -f marker "gone$i"\n'
        '  "./gone$i"\n'
        "done 2>&1 | grep -c 'marker must not run'\n"
        "echo session-still-works\n"
    )
    result = attacker.run(
        attack,
        mode=mode,
        env=env,
        options=["--exec-dir", str(tools)] if mode == "strict-exec" else [],
    )
    assert sorted(p.name for p in attacker.traces.iterdir()) == [], result.stderr
    lines = result.stdout.decode().split()
    # Inside a sandbox the rule-named path is its stand-in's mount (docs/sandbox.md, "The exec
    # backstop"): it can be neither replaced (EBUSY) nor linked (EXDEV), so nothing is asked.
    denials = str(ATTEMPTS) if mode == "off" else "0"
    assert lines == [denials, "session-still-works"], result.stderr
