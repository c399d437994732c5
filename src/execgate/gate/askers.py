"""Askers that put a ``prompt`` decision to a human: the terminal (``execgate run``).

The MCP front end has its own asker (elicitation); see :mod:`execgate.mcpserver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import termios
from pathlib import Path
from typing import Any

from execgate import paths
from execgate.gate.escalation import (
    Answer,
    Approval,
    ApprovalRequest,
    NetworkTarget,
    no_one_to_ask,
    rule_location,
)
from execgate.gate.program import GatedExec, parent_chain
from execgate.policy import PolicyError
from execgate.policy.amend import allow_rule_line, network_allow_line
from execgate.visible import command_line, quote_word, visible

_CHOICES = {
    "o": Answer.ALLOW_ONCE,
    "once": Answer.ALLOW_ONCE,
    "r": Answer.ALLOW_SESSION,
    "run": Answer.ALLOW_SESSION,
    "a": Answer.ALLOW_ALWAYS,
    "always": Answer.ALLOW_ALWAYS,
    "d": Answer.DENY,
    "deny": Answer.DENY,
    "n": Answer.DENY,
    "no": Answer.DENY,
    "": Answer.DENY,
}


class DenyingAsker:
    """Answers every question with a denial that says why and how to allow the command."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def ask(self, request: ApprovalRequest) -> Approval:
        return no_one_to_ask(request, self.why)


def describe(request: ApprovalRequest) -> list[str]:
    """The lines a human sees: the command as judged (the identified program), what the caller
    called it, cwd, process chain, the rules that ask. Every text is rendered visible."""
    exec_ = request.exec
    chain = " ← ".join(
        f"{quote_word(comm)} ({pid})" for pid, comm in parent_chain(exec_.pid, depth=4)
    )
    if request.network is not None:
        return _describe_network(request.network, exec_, chain)
    justification = request.judgement.justification()
    lines = [
        f"execgate: `{exec_.display_judged()}` requires approval"
        + (f": {visible(justification, 1000)}" if justification else "")
    ]
    if request.purpose:  # a permission request: the purpose says what, and why
        lines = [f"execgate: {request.purpose}"]
    if exec_.argv0_differs():
        lines.append(f"  argv[0]: {quote_word(exec_.argv[0])} (the name the caller gave it)")
    if exec_.realpath and exec_.path != exec_.realpath:
        lines.append(f"  path:    {quote_word(exec_.path)} (as executed)")
    for interp in exec_.interpreters:
        words = [interp.name, *([interp.arg] if interp.arg else [])]
        lines.append(f"  interpreter: {command_line(words)}")
    lines += [
        f"  cwd:     {quote_word(exec_.cwd)}",
        f"  process: {chain or exec_.pid}",
    ]
    for match in request.judgement.deciding_matches():
        prefix = command_line(match.matched_prefix)
        lines.append(f"  rule:    {visible(rule_location(match))} (prefix `{prefix}`)")
    return lines


def _describe_network(net: NetworkTarget, exec_: GatedExec, chain: str) -> list[str]:
    lines = [
        f"execgate: network access to {net.display()} requires approval"
        + (f": {visible(net.justification, 1000)}" if net.justification else "")
    ]
    lines.append(f"  address: {', '.join(net.addresses) or 'unknown'}")
    if exec_.pid:
        lines.append(f"  by:      {exec_.display(400)}")
        lines.append(f"  process: {chain or exec_.pid}")
    else:
        lines.append("  by:      a process of the session (not identified)")
    for rule in net.rules:
        lines.append(f"  rule:    {visible(rule, 600)}")
    if not net.rules:
        lines.append("  rule:    none names this host (network.default = prompt)")
    return lines


class TerminalAsker:
    """Asks on the controlling terminal, one question at a time.

    While a gated exec waits for the answer, execgate briefly takes the terminal's foreground
    (an interactive shell may own it) and gives it back afterwards.
    """

    def __init__(self, tty: Path = Path("/dev/tty")) -> None:
        self._tty = tty
        self._lock = asyncio.Lock()

    async def ask(self, request: ApprovalRequest) -> Approval:
        async with self._lock:
            try:
                fd = os.open(self._tty, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:
                return no_one_to_ask(request, "there is no terminal to ask")
            try:
                return await self._ask_on(fd, request)
            finally:
                os.close(fd)

    async def _ask_on(self, fd: int, request: ApprovalRequest) -> Approval:
        previous = _take_foreground(fd)
        saved = _interrupt_ends_the_line(fd)
        try:
            termios.tcflush(fd, termios.TCIFLUSH)  # typed-ahead input is not an answer
            always = ", [a]lways" if request.offer_always else ""
            lines = describe(request)
            if request.offer_always:
                lines.append(f"  always:  {always_note(request)}")
            question = f"Allow? [o]nce, for this [r]un{always}, [d]eny (default deny): "
            os.write(fd, ("\n" + "\n".join(lines) + "\n" + question).encode())
            while True:
                line = await _read_line(fd)
                if line is None:
                    return no_one_to_ask(request, "the terminal closed")
                if line.endswith(_INTERRUPT):  # Ctrl-C: an answer, and the safe one
                    os.write(fd, b"^C\ndenied (Ctrl-C)\n")
                    return Approval(Answer.DENY, reason="declined at the terminal (Ctrl-C)",
                                    by="terminal")  # fmt: skip
                answer = _CHOICES.get(line.strip().lower())
                if answer == Answer.ALLOW_ALWAYS and not request.offer_always:
                    answer = None
                if answer is not None:
                    break
                choices = "o, r" + (", a" if request.offer_always else "") + " or d"
                shown = visible(line.strip(), 40)
                os.write(fd, f"`{shown}` is not an answer; type {choices}: ".encode())
        finally:
            _restore(fd, saved)
            _give_back_foreground(fd, previous)
        if answer == Answer.ALLOW_ALWAYS:
            os.write(fd, f"execgate: {always_note(request, done=True)}\n".encode())
        reason = None if answer != Answer.DENY else "declined at the terminal"
        return Approval(answer, reason=reason, by="terminal")


def always_note(request: ApprovalRequest, *, done: bool = False) -> str:
    """The exact line an "always" answer appends, and the file it goes to."""
    net = request.network
    try:
        line = (
            network_allow_line(net.host, net.protocol)
            if net is not None
            else allow_rule_line(request.prefix)
        )
        rule = visible(line, 2000)
    except PolicyError:
        rule = "(no allow rule can name this prefix)"
    target = quote_word(str(paths.user_default_rules_file()))
    return f"{'appended' if done else 'appends'} {rule} to {target}"


_INTERRUPT = "\x03"


def _interrupt_ends_the_line(fd: int) -> list[Any] | None:
    """While the question is open, Ctrl-C is an answer, not a signal: the terminal delivers
    it as the end of a line (``VEOL``) instead of interrupting. Returns the settings to
    restore (``None``: not a terminal we can set)."""
    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        return None
    changed = [*saved[:6], list(saved[6])]
    changed[3] = changed[3] & ~termios.ISIG
    changed[6][termios.VEOL] = _INTERRUPT.encode()
    try:
        termios.tcsetattr(fd, termios.TCSANOW, changed)
    except termios.error:
        return None
    return saved


def _restore(fd: int, saved: list[Any] | None) -> None:
    if saved is not None:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSANOW, saved)


async def _read_line(fd: int) -> str | None:
    """One line from a terminal without blocking the event loop (canonical mode)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    data = bytearray()
    try:
        while not data.endswith((b"\n", _INTERRUPT.encode())):
            waiter = loop.create_future()
            loop.add_reader(fd, waiter.set_result, None)
            try:
                await waiter
            finally:
                loop.remove_reader(fd)
            try:
                chunk = os.read(fd, 1024)
            except BlockingIOError:
                continue
            except OSError:
                return None
            if not chunk:
                return None if not data else data.decode(errors="replace")
            data += chunk
        return data.decode(errors="replace")
    finally:
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)


def _take_foreground(fd: int) -> int | None:
    """Make our process group the terminal's foreground; return the previous one."""
    try:
        current = os.tcgetpgrp(fd)
    except OSError:
        return None
    ours = os.getpgrp()
    if current == ours:
        return None
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, ours)
    except OSError:
        return None
    finally:
        signal.signal(signal.SIGTTOU, previous)
    return current


def _give_back_foreground(fd: int, previous: int | None) -> None:
    if previous is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, previous)
    finally:
        signal.signal(signal.SIGTTOU, old)
