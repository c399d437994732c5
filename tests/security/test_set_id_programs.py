"""Issue 9 item 2: set-id and file-capability programs do not hand out ungated children.

The kernel runs them in secure mode and the loader drops ``LD_PRELOAD``, so whatever they start
is ungated. Each attack below starts the forbidden marker through one of them — ``newgrp``,
``sg``, ``ssh-agent CMD`` (set-gid), ``sudo`` when installed, and a capability copy of bash made
by root — from a gated session in every mode, and from a program escalated out of the sandbox.
Outside a sandbox the gate refuses such a program unless a rule names it, saying why; inside
one, no-new-privs keeps it unprivileged and gated. A rule naming it lets it run, and the audit
log says why it was let out of the gate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import MODES, Attacker

ATTACKS = [
    "echo marker | newgrp",
    'sg "$(id -gn)" -c marker',
    "ssh-agent marker",
    "sudo -n marker",
]


def available(command: str) -> bool:
    program = command.split("|")[-1].split()[0]
    return shutil.which(program, path="/usr/bin:/bin:/usr/sbin:/sbin") is not None


def capability_copy(a: Attacker) -> Path:
    """A copy of bash with a file capability, made by root (after the tree was handed over:
    a chown clears capabilities)."""
    if not shutil.which("setcap"):
        pytest.skip("setcap (libcap2-bin) is not installed")
    copy = a.bin / "capbash"
    shutil.copy("/bin/bash", copy)
    copy.chmod(0o755)
    subprocess.run(["setcap", "cap_net_bind_service+ep", str(copy)], check=True)
    return copy


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("command", ATTACKS)
def test_set_id_programs_do_not_run_the_forbidden_marker(
    attacker: Attacker, mode: str, command: str
) -> None:
    if not available(command):
        pytest.skip(f"{command.split()[0]} is not installed")
    result = attacker.run(f"{command}\necho session-still-works\n", mode=mode)
    assert not attacker.ran(), result.stderr
    assert b"session-still-works" in result.stdout, result.stderr
    if mode == "off":
        assert b"nothing it starts would be gated, and no rule names it" in result.stderr, (
            result.stderr
        )


@pytest.mark.parametrize("mode", MODES)
def test_a_capability_copy_does_not_run_the_forbidden_marker(attacker: Attacker, mode: str) -> None:
    capability_copy(attacker)
    result = attacker.run("capbash -c marker\necho session-still-works\n", mode=mode)
    assert not attacker.ran(), result.stderr
    assert b"session-still-works" in result.stdout, result.stderr
    if mode == "off":
        assert b"a program with file capabilities" in result.stderr, result.stderr


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_an_escalated_program_cannot_start_a_set_id_program(attacker: Attacker, mode: str) -> None:
    """Escalated programs run outside the sandbox, without no-new-privs: the same rule holds."""
    attacker.write_rules(
        'prefix_rule(["marker"], "forbidden", justification="marker must not run")\n'
        'prefix_rule(["dash"], "allow")\n'
    )
    result = attacker.run(
        "dash -c 'echo marker | newgrp; ssh-agent marker; echo escalated-dash-done'\n"
        "echo session-still-works\n",
        mode=mode,
    )
    assert not attacker.ran(), result.stderr
    assert b"escalated-dash-done" in result.stdout, result.stderr
    assert b"session-still-works" in result.stdout, result.stderr
    assert result.stderr.count(b"no rule names it") == 2, result.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_rule_naming_a_set_id_program_lets_it_run_and_says_why(
    attacker: Attacker, mode: str
) -> None:
    attacker.write_rules('prefix_rule(["ssh-agent"], "allow")\n')
    audit = attacker.work / "audit.jsonl"
    result = attacker.run(
        "ssh-agent /bin/echo agent-ran", mode=mode, options=["--audit", str(audit)]
    )
    assert b"agent-ran" in result.stdout, result.stderr
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    agent = [e for e in entries if e["argv"][:1] == ["ssh-agent"]]
    assert agent and agent[0]["decision"] == ("run" if mode == "off" else "escalate"), entries
    reason = agent[0]["reason"]
    assert reason.startswith("a set-gid program (runs with group _ssh), allowed by rule")
    assert reason.endswith("runs ungated")
