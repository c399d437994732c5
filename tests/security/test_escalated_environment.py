"""Issue 9 item 1: an escalated program must not run the caller's code.

The attacks are git's: ``GIT_CONFIG_COUNT/KEY/VALUE`` setting ``core.fsmonitor`` (git runs it on
``git status``), ``GIT_EXTERNAL_DIFF`` (``git diff`` runs it) and ``git log --output=FILE``
(writes FILE). Each hook writes a witness into a folder outside the sandbox's writable roots;
with the built-in policy git runs inside the sandbox (the witness cannot be written, nor can
``.git/config``), and with a user rule that escalates git its environment is cleaned of the
caller's variables, so the hooks do not run at all.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import Attacker


def make_repo(a: Attacker) -> Path:
    repo = a.work  # .git is protected at the top of a writable root
    git = ["git", "-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@t"]
    git += ["-C", str(repo)]
    subprocess.run([*git[:-2], "init", "-q", str(repo)], check=True)
    (repo / "file.txt").write_text("one\n")
    subprocess.run([*git, "add", "file.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (repo / "file.txt").write_text("two\n")  # so `git diff` has something to show
    hook = a.work / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho "$0 $*" > {a.outside}/ran-$(basename "$WITNESS")\nexit 0\n')
    hook.chmod(0o755)
    a.give(a.work)
    return repo


def attack(a: Attacker, repo: Path) -> str:
    hook = a.work / "hook.sh"
    return (
        f"cd {repo}\n"
        # core.fsmonitor runs a program on every `git status`
        f"WITNESS=fsmonitor GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.fsmonitor "
        f"GIT_CONFIG_VALUE_0={hook} git status --short\n"
        # GIT_EXTERNAL_DIFF runs instead of the built-in diff
        f"WITNESS=extdiff GIT_EXTERNAL_DIFF={hook} git diff\n"
        # git log --output=FILE writes FILE: the protected .git/config, and a file outside
        "git log -1 --format='[core]%n  fsmonitor = /bin/false' --output=.git/config\n"
        f"git log -1 --output={a.outside}/ran-output\n"
        "echo session-still-works\n"
    )


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_git_hooks_do_not_run_outside_the_sandbox_under_the_built_in_policy(
    attacker: Attacker, mode: str
) -> None:
    repo = make_repo(attacker)
    config_before = (repo / ".git" / "config").read_bytes()
    result = attacker.run(attack(attacker, repo), mode=mode, rules=False)
    assert b"session-still-works" in result.stdout, result.stderr
    assert sorted(p.name for p in attacker.outside.iterdir()) == [], result.stderr
    assert (repo / ".git" / "config").read_bytes() == config_before


@pytest.mark.parametrize("mode", ["workspace-write", "strict-exec"])
def test_an_escalated_git_gets_none_of_the_callers_code(attacker: Attacker, mode: str) -> None:
    repo = make_repo(attacker)
    attacker.write_rules(
        'prefix_rule(["git", "status"], "allow")\nprefix_rule(["git", "diff"], "allow")\n'
    )
    result = attacker.run(attack(attacker, repo), mode=mode)
    assert b"session-still-works" in result.stdout, result.stderr
    # git status and diff ran (escalated), without the caller's hooks
    assert b"M file.txt" in result.stdout, result.stderr
    assert b"+two" in result.stdout, result.stderr
    assert not (attacker.outside / "ran-fsmonitor").exists()
    assert not (attacker.outside / "ran-extdiff").exists()


def test_the_escalated_environment_keeps_the_sessions_own_values(attacker: Attacker) -> None:
    """Cleaned variables are not removed: they get the value the session started with."""
    attacker.write_rules('prefix_rule(["printenv"], "allow")\n')
    command = (
        "PYTHONPATH=/evil GIT_CONFIG_COUNT=9 NODE_OPTIONS=--require=/evil HOME=/evil "
        "MY_PLUGIN=/evil KEPT=yes printenv PYTHONPATH GIT_CONFIG_COUNT NODE_OPTIONS HOME "
        "MY_PLUGIN KEPT"
    )
    config = attacker.base / "xhome" / "config.toml"
    config.write_text('clean_escalated_env = ["MY_*"]\n')
    attacker.give(config)
    result = attacker.run(command, mode="workspace-write", env={"PYTHONPATH": "/session/own"})
    home = attacker.env["HOME"]
    assert result.stdout.decode().split() == ["/session/own", home, "yes"], result.stderr
