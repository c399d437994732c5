"""What a human reads to decide shows the command as it is (issue: a command's own escape
sequences rewrote the terminal prompt; ``exec -a`` put another program's name in the headline).

The rendering functions get property tests; the prompt is read off a real terminal (tmux), as
root and as an unprivileged user; denial lines are read from ``execgate run``'s stderr.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import unicodedata
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.visible import command_line, quote_word, visible

from .conftest import EXECGATE, Gate

if TYPE_CHECKING:  # the fixture's type (tests/conftest.py)
    from conftest import UnprivilegedUser

HIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}
BIDI = [chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x61C]]
ATTACK = "x\033[1A\033[2K\rexecgate: \033[32mthis is: ls -la\033[0m"
ATTACK_SHOWN = r"$'{dir}/x\e[1A\e[2K\rexecgate: \e[32mthis is: ls -la\e[0m'"

nasty_text = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\033", "\r", "\n", "\x9b", "\x7f", "\x00", "'", "\\", *BIDI]),
        st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),  # undecodable bytes
    )
)


nasty_bytes = st.one_of(
    st.binary(max_size=40), nasty_text.map(lambda t: t.encode("utf-8", "surrogateescape"))
).filter(lambda b: b"\0" not in b)


def _no_hidden(text: str) -> bool:
    return not any(unicodedata.category(ch) in HIDDEN for ch in text)


@given(nasty_text, st.one_of(st.none(), st.integers(min_value=0, max_value=80)))
def test_visible_text_has_no_hidden_characters(text: str, limit: int | None) -> None:
    shown = visible(text, limit)
    assert _no_hidden(shown)
    shown.encode("utf-8")  # printable as UTF-8 (no lone surrogates)
    if limit is None:
        assert (shown == text) == _no_hidden(text)
    elif shown != text and "…" in shown:  # a cut says how many characters it hides
        hidden = int(shown.rsplit("(", 1)[1].split()[0])
        assert 0 < hidden <= len(text)


@given(st.lists(nasty_text, min_size=1, max_size=5), st.one_of(st.none(), st.integers(0, 80)))
def test_command_line_has_no_hidden_characters(words: list[str], limit: int | None) -> None:
    shown = command_line(words, limit)
    assert _no_hidden(shown)
    shown.encode("utf-8")
    total = len(command_line(words))  # the whole line, uncut
    if limit is not None and "…" in shown and shown.endswith(" more characters)"):
        hidden = int(shown.rsplit("(", 1)[1].split()[0])
        assert 0 < hidden <= total


@given(nasty_text)
def test_a_word_reads_back_as_itself_in_bash(word: str) -> None:
    """The escaped form is a real shell word: bash reads back exactly the original bytes."""
    data = word.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        return  # no argument can hold a NUL
    out = subprocess.run(
        ["bash", "-c", f"printf %s {quote_word(word)}"], capture_output=True, check=True
    ).stdout
    assert out == data


def test_cuts_say_how_much_they_hide() -> None:
    assert visible("a" * 100, 10) == "a" * 10 + "… (90 more characters)"
    assert command_line(["echo", "y" * 1000], 20) == "echo " + "y" * 15 + "… (985 more characters)"
    shown = command_line(["touch", "\033" * 5000], 40)
    assert shown.startswith("touch $'\\e") and shown.endswith("more characters)")
    assert command_line(["touch", "/tmp/" + ATTACK]) == "touch " + ATTACK_SHOWN.format(dir="/tmp")
    assert quote_word("\u202eexe.txt") == "$'\\u202eexe.txt'"


# -- the terminal prompt, read off a real terminal ------------------------------------------


class Tmux:
    """A tmux server of its own running one command in a wide pane; read the screen."""

    def __init__(self, command: Sequence[str], user: UnprivilegedUser | None = None) -> None:
        self.user = user
        self.socket = f"egtest-{uuid.uuid4().hex[:10]}"
        shell = shlex.join(command) + "; echo EXIT=$?; sleep 120"
        self._tmux("new-session", "-d", "-x", "250", "-y", "50", "bash", "-c", shell)

    def _tmux(self, *args: str) -> str:
        argv = ["tmux", "-L", self.socket, "-f", "/dev/null", *args]
        if self.user is not None:
            argv = self.user.argv(argv)
        env = self.user.env() if self.user else {**os.environ}
        env["TERM"] = "xterm-256color"
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout

    def screen(self) -> list[str]:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-50").splitlines()

    def wait_for(self, text: str, timeout: float = 60) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if any(text in line for line in lines):
                return lines
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} on the screen:\n" + "\n".join(lines))
            time.sleep(0.1)

    def type(self, keys: str) -> None:
        self._tmux("send-keys", "-t", "0", keys, "Enter")

    def close(self) -> None:
        subprocess.run(
            (self.user.argv if self.user else list)(["tmux", "-L", self.socket, "kill-server"]),
            capture_output=True,
        )


def _prompt_on_a_terminal(folder: Path, user: UnprivilegedUser | None) -> None:
    rules = folder / "touch.rules"
    rules.write_text('prefix_rule(["touch"], "prompt")\n')
    attack = "\\033[1A\\033[2K\\rexecgate: \\033[32mthis is: ls -la\\033[0m"
    script = f"touch \"$(printf '{folder}/x{attack}')\""
    env = user.env() if user else {"PATH": os.environ["PATH"], "HOME": str(folder)}
    env |= {"EXECGATE_HOME": str(folder / "eghome"), "LANG": "C.UTF-8"}
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    command += [*EXECGATE, "run", "--rules", str(rules), "--", "bash", "-c", script]
    if user is not None:
        user.chown_tree(folder)
    term = Tmux(command, user)
    try:
        lines = term.wait_for("Allow?")
        touch = os.path.realpath(shutil.which("touch") or "/usr/bin/touch")
        headline = f"execgate: `{touch} {ATTACK_SHOWN.format(dir=folder)}` requires approval"
        assert headline in lines, "\n".join(lines)  # the first line of the prompt is intact
        assert not any(line.startswith("execgate: this is") for line in lines)
        term.type("d")
        lines = term.wait_for("EXIT=")
        assert "EXIT=126" in lines, "\n".join(lines)
        assert not any(p.name.startswith("x") for p in folder.iterdir())  # touch did not run
    finally:
        term.close()


def test_prompt_shows_escape_sequences_escaped(tmp_path: Path) -> None:
    _prompt_on_a_terminal(tmp_path, None)


def test_prompt_shows_escape_sequences_escaped_unprivileged(
    unprivileged: UnprivilegedUser,
) -> None:
    _prompt_on_a_terminal(unprivileged.make_dir(), unprivileged)


def test_prompt_names_the_identified_program_not_argv0(gate: Gate) -> None:
    """``exec -a ls …/marker -f X`` under a prompt rule on marker: the headline names marker."""
    gate.write_rules('prefix_rule(["marker"], "prompt")\n')
    env = {**gate.env, "HOME": str(gate.root)}
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    command += [*EXECGATE, "run", "--rules", str(gate.rules), "--"]
    command += ["bash", "-c", f"exec -a ls {gate.bin}/marker -f X"]
    term = Tmux(command)
    try:
        lines = term.wait_for("Allow?")
        assert f"execgate: `{gate.bin}/marker -f X` requires approval" in lines, lines
        assert "  argv[0]: ls (the name the caller gave it)" in lines, lines
        term.type("d")
        term.wait_for("EXIT=")
        assert not gate.ran("ls") and not gate.ran("marker")
    finally:
        term.close()


# -- denial lines --------------------------------------------------------------------------


def test_denial_line_shows_hidden_characters_escaped(gate: Gate) -> None:
    """A forbidden command whose arguments carry escapes, bidi overrides and a newline: the
    denial (the server's and the interposer's own) is one line with all of them escaped."""
    args = "$'\\e[2K\\rok\\u202eexe.txt\\nsecond line\\xff'"
    result = gate.run(f"marker {args}; echo rc=$?")
    err = result.stderr.decode("utf-8", "surrogateescape")
    assert result.stdout == b"rc=126\n"
    assert not gate.ran()
    line = "execgate: denied: marker $'\\e[2K\\rok\\u202eexe.txt\\nsecond line\\xff': "
    assert err.startswith(line), err
    assert _no_hidden(err.splitlines()[0])


def test_interposer_denial_line_is_escaped(gate: Gate, tmp_path: Path) -> None:
    """The interposer's own denial (no server to ask: the socket is gone) renders the same."""
    env = {**gate.env, "EXECGATE_SOCKET": str(tmp_path / "gone.sock"), "EXECGATE_TOKEN": "0" * 32}
    preload = Path(sys.modules["execgate"].__file__ or "").parent / "_bin" / "libexecgate.so"
    env["LD_PRELOAD"] = str(preload)
    result = subprocess.run(
        ["bash", "-c", "/bin/echo $'\\e]0;title\\a\\u2067x\\x9b' $'\\xc2\\x9b2J'"],
        env=env,
        capture_output=True,
    )
    err = result.stderr.decode("utf-8", "surrogateescape")
    assert result.returncode == 126 and result.stdout == b""
    assert err.startswith(
        "execgate: denied: /bin/echo $'\\e]0;title\\a\\u2067x\\x9b' $'\\u009b2J': "
    ), err
    assert _no_hidden(err.splitlines()[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(nasty_bytes, max_size=4))
def test_interposer_denial_never_shows_hidden_characters(
    tmp_path_factory: Any, args: list[bytes]
) -> None:
    """The C renderer on arbitrary bytes (invalid UTF-8, C1 as bytes and as characters, bidi):
    one line of valid UTF-8 without a hidden character."""
    gone = tmp_path_factory.getbasetemp() / "gone.sock"
    preload = Path(sys.modules["execgate"].__file__ or "").parent / "_bin" / "libexecgate.so"
    env = {"EXECGATE_SOCKET": str(gone), "EXECGATE_TOKEN": "0" * 32, "LD_PRELOAD": str(preload)}
    result = subprocess.run(
        [b"bash", b"-c", b'exec "$@"', b"bash", b"/bin/echo", *args], env=env, capture_output=True
    )
    assert result.returncode == 126 and result.stdout == b""
    line = result.stderr.split(b"\n", 1)[0].decode("utf-8")  # strict: invalid bytes escaped
    assert line.startswith("execgate: denied: /bin/echo")
    assert _no_hidden(line), line
