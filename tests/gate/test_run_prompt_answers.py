"""How the terminal prompt takes answers (on a real pty that is the controlling terminal):
Ctrl-C is a denial that says so, an answer it does not know asks again, and "always" shows the
exact rule line and the file before anything is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import Gate
from .test_run_terminal import Terminal, _execgate


@pytest.fixture
def prompting(gate: Gate) -> Gate:
    gate.write_rules('prefix_rule(["other", "push"], "prompt", justification="it publishes")\n')
    return gate


def test_ctrl_c_at_the_prompt_denies_and_the_session_goes_on(prompting: Gate) -> None:
    term = Terminal(
        _execgate(prompting, "--", "bash", "-c", "other push; echo rc=$?; echo still-here"),
        prompting.env,
        prompting.root,
    )
    term.expect(rb"Allow\?")
    term.type(b"\x03")  # Ctrl-C while the question is open
    term.expect(rb"denied \(Ctrl-C\)")
    term.expect(rb"execgate: denied: other push: declined at the terminal \(Ctrl-C\)")
    term.expect(rb"rc=126\r\nstill-here")
    assert term.finish() == 0
    assert not prompting.ran("other")


def test_an_unknown_answer_asks_again(prompting: Gate) -> None:
    term = Terminal(
        _execgate(prompting, "--", "bash", "-c", "other push; echo rc=$?"),
        prompting.env,
        prompting.root,
    )
    term.expect(rb"Allow\?")
    term.type(b"yes\n")  # not one of the answers: neither allowed nor denied
    term.expect(rb"`yes` is not an answer; type o, r or d: ")
    assert not prompting.ran("other")
    term.type(b"\x1b[31mx\n")  # what it echoes back is shown visibly
    term.expect(rb"`\\e\[31mx` is not an answer")
    term.type(b"o\n")
    term.expect(rb"rc=0")
    assert term.finish() == 0
    assert prompting.ran("other")


def test_always_shows_the_rule_line_and_its_file_before_writing(gate: Gate) -> None:
    user_rules = Path(gate.env["EXECGATE_HOME"]) / "rules"
    user_rules.mkdir()
    (user_rules / "mine.rules").write_text('prefix_rule(["other", "push"], "prompt")\n')
    target = user_rules / "default.rules"
    line = 'prefix_rule(pattern=["other", "push"], decision="allow")'
    term = Terminal(
        _execgate(gate, "--", "bash", "-c", "other push; echo rc=$?", rules=False),
        gate.env,
        gate.root,
    )
    term.expect(rb"always:  appends " + re.escape(f"{line} to {target}".encode()))
    term.expect(rb"\[a\]lways, \[d\]eny")
    assert not target.exists()  # shown, not yet written
    term.type(b"a\n")
    term.expect(rb"execgate: appended " + re.escape(f"{line} to {target}".encode()))
    term.expect(rb"rc=0")
    assert term.finish() == 0
    assert target.read_text() == line + "\n"
