"""Prompts on a real terminal (a pty that is the controlling terminal), and Ctrl-C."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import EXECGATE, Gate

# Become the session leader of a new session whose controlling terminal is our stdin.
ATTACH = (
    "import os, sys; os.close(os.open(os.ttyname(0), os.O_RDWR)); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


class Terminal:
    """A program running on a pseudo-terminal; read its screen, type into it."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ATTACH, *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        os.close(slave)
        self.screen = b""

    def expect(self, pattern: bytes, timeout: float = 60) -> re.Match[bytes]:
        """Read until ``pattern`` shows up (the timeout only guards against a hang)."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.screen)
            if match:
                self.screen = self.screen[match.end() :]
                return match
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {pattern!r} in {self.screen!r}")
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # EIO: the other side is gone
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"terminal closed before {pattern!r}: {self.screen!r}")
                self.screen += chunk

    def type(self, text: bytes) -> None:
        os.write(self.master, text)

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        os.close(self.master)
        return code


def _execgate(gate: Gate, *args: str, rules: bool = True) -> list[str]:
    return [*EXECGATE, "run", *(["--rules", str(gate.rules)] if rules else []), *args]


@pytest.fixture
def prompting(gate: Gate) -> Gate:
    gate.write_rules('prefix_rule(["other", "push"], "prompt", justification="it publishes")\n')
    return gate


def test_allow_once_runs_it(prompting: Gate) -> None:
    term = Terminal(
        _execgate(prompting, "--", "bash", "-c", "other push now; echo rc=$?"),
        prompting.env,
        prompting.root,
    )
    term.expect(rb"/bin/other push now` requires approval: it publishes")
    term.expect(
        rb"rule: +" + re.escape(str(prompting.rules).encode()) + rb":1 \(prefix `other push`\)"
    )
    term.expect(rb"Allow\? \[o\]nce, for this \[r\]un, \[d\]eny")  # no "always" with --rules
    term.type(b"o\n")
    term.expect(rb"push now\r\nrc=0")
    assert term.finish() == 0
    assert prompting.ran("other")


def test_deny_is_the_default_answer(prompting: Gate) -> None:
    term = Terminal(
        _execgate(prompting, "--", "bash", "-c", "other push; echo rc=$?"),
        prompting.env,
        prompting.root,
    )
    term.expect(rb"Allow\?")
    term.type(b"\n")
    term.expect(rb"execgate: denied: other push: declined at the terminal")
    term.expect(rb"rc=126")
    assert term.finish() == 0
    assert not prompting.ran("other")


def test_allow_for_this_run_asks_once(prompting: Gate) -> None:
    term = Terminal(
        _execgate(prompting, "--", "bash", "-c", "other push 1; other push 2; echo done"),
        prompting.env,
        prompting.root,
    )
    term.expect(rb"Allow\?")
    term.type(b"r\n")
    term.expect(rb"push 1\r\n")
    term.expect(rb"push 2\r\ndone")
    assert b"Allow?" not in term.screen
    assert term.finish() == 0


def test_always_records_a_rule_and_is_not_asked_again(gate: Gate) -> None:
    user_rules = Path(gate.env["EXECGATE_HOME"]) / "rules"
    user_rules.mkdir()
    (user_rules / "mine.rules").write_text(
        'prefix_rule(["other", "push"], "prompt", justification="it publishes")\n'
    )
    term = Terminal(
        _execgate(gate, "--", "bash", "-c", "other push; echo rc=$?", rules=False),
        gate.env,
        gate.root,
    )
    term.expect(rb"\[a\]lways")
    term.type(b"a\n")
    term.expect(rb"rc=0")
    assert term.finish() == 0
    recorded = (user_rules / "default.rules").read_text()
    assert recorded == 'prefix_rule(pattern=["other", "push"], decision="allow")\n'
    # A new run: the user's own allow rule answers the prompt.
    result = gate.run("other push; echo rc=$?", rules=False)
    assert result.stdout.endswith(b"rc=0\n"), result.stderr
    # `execgate check` still reports Codex's verdict for the rules as written.
    check = subprocess.run(
        [*EXECGATE, "check", "--", "other", "push"], env=gate.env, capture_output=True
    )
    assert b'"decision":"prompt"' in check.stdout


def test_prompt_inside_an_interactive_shell(prompting: Gate) -> None:
    """An interactive bash owns the terminal's foreground; the prompt still gets the answer."""
    env = {**prompting.env, "PS1": "gated$ "}
    term = Terminal(
        _execgate(prompting, "--", "bash", "--norc", "--noprofile", "-i"), env, prompting.root
    )
    term.expect(rb"gated\$ ")
    term.type(b"other push x; echo rc=$?\n")
    term.expect(rb"Allow\?")
    term.type(b"o\n")
    term.expect(rb"push x\r\nrc=0")
    term.expect(rb"gated\$ ")
    term.type(b"exit 4\n")
    assert term.finish() == 4


def test_ctrl_c_leaves_no_process_behind(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["perl"], "allow")\n')
    tag = gate.tag
    script = (
        f"perl -e '$0=\"{tag}-escalated\"; sleep 1000' & "
        f"bash -c 'exec -a {tag}-child sleep 1000' & "
        f"until [ $(pgrep -c -f '^{tag}-') = 2 ]; do :; done; echo ready; wait"
    )
    options = ["--sandbox", "workspace-write"]
    term = Terminal(_execgate(gate, *options, "--", "bash", "-c", script), gate.env, gate.root)
    term.expect(rb"ready")
    assert len(gate.leftovers()) == 2
    term.type(b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground process group
    code = term.finish()
    assert code in (-2, 130)
    assert gate.leftovers() == []


def test_a_pending_prompt_does_not_hold_up_other_execs(prompting: Gate) -> None:
    """While one exec waits for the human, the rest of the tree keeps getting answers."""
    go = prompting.root / "go"
    os.mkfifo(go)
    script = (
        f"other push & read start < {go}; "
        "for i in $(seq 200); do other run >/dev/null; done; echo others-done; wait; echo end"
    )
    term = Terminal(_execgate(prompting, "--", "bash", "-c", script), prompting.env, prompting.root)
    term.expect(rb"Allow\?")  # the question is open...
    with open(go, "w") as fifo:
        fifo.write("go\n")
    term.expect(rb"others-done")  # ...and 200 gated execs (server round trips) got answers
    term.type(b"o\n")
    term.expect(rb"end")
    assert term.finish() == 0
