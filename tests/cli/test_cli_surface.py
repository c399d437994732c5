"""What a new user types first: --version, --help (a description and examples for every
command), --json output, shell completion, exit statuses and messages of ``execgate run``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cliharness import World, one_error

from execgate import __version__
from execgate.cli import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


# Runs `execgate ... --help` for every command in one process (each in a fresh parser, as
# the command line would), separated by a marker line.
HELP_ALL = """
import contextlib, io, json, sys
from execgate.cli import main
for command in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*command, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, command
    print(out.getvalue() + "\\0", end="")
"""


def test_every_command_has_a_description_and_examples(world: World) -> None:
    commands = [(), *_commands(build_parser())]
    assert ("rules", "explain") in commands and ("completion",) in commands
    done = subprocess.run(
        [sys.executable, "-c", HELP_ALL, json.dumps(commands)],
        env=world.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    helps = done.stdout.split("\0")[:-1]
    assert len(helps) == len(commands), done.stderr
    for command, shown in zip(commands, helps, strict=True):
        assert shown.startswith(f"usage: {' '.join(['execgate', *command])}"), shown
        head, _, examples = shown.partition("\nexamples:\n")
        lines = examples.strip().splitlines()
        assert lines and all("execgate " in line for line in lines), (command, shown)
        # usage, then a description paragraph of its own
        assert len(head.split("\n\n")[1].split()) >= 5, (command, shown)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_mcp_version(world: World, flag: str) -> None:
    shown = world.run("mcp", flag)
    assert (shown.returncode, shown.stdout) == (0, f"execgate {__version__}\n")


def test_sandbox_check_json(world: World) -> None:
    done = world.run("sandbox", "check", "--json")
    report = json.loads(done.stdout)
    assert set(report["profiles"]) >= {"read-only", "workspace-write"}
    assert done.returncode == (0 if report["all_profiles_work"] else 1)


def test_bash_completion_offers_commands_and_options(world: World) -> None:
    script = world.run("completion", "bash").stdout
    probe = (
        'source /dev/stdin; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
        'COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; _shtab_execgate; echo "${COMPREPLY[*]}"'
    )

    def complete(*words: str) -> set[str]:
        done = subprocess.run(
            ["bash", "-c", probe, "bash", "execgate", *words],
            input=script,
            capture_output=True,
            text=True,
        )
        return set(done.stdout.split())

    assert complete("ru") == {"rules", "run"}
    assert complete("rules", "") >= {"list", "test", "explain", "init"}
    assert {"--json", "--full"} <= complete("rules", "list", "--")
    assert complete("completion", "") == {"bash", "zsh", "fish"}


@pytest.mark.skipif(not shutil.which("fish"), reason="fish is not installed")
def test_fish_completion(world: World, tmp_path: Path) -> None:
    script = tmp_path / "execgate.fish"
    script.write_text(world.run("completion", "fish").stdout)
    done = subprocess.run(
        ["fish", "-c", f"source {script}; complete -C 'execgate rules '"],
        capture_output=True,
        text=True,
    )
    offered = {line.split("\t")[0] for line in done.stdout.splitlines()}
    assert offered >= {"list", "test", "explain", "init"}, done


@pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed")
def test_zsh_completion(world: World, tmp_path: Path) -> None:
    script = tmp_path / "_execgate"
    script.write_text(world.run("completion", "zsh").stdout)
    assert subprocess.run(["zsh", "-n", str(script)]).returncode == 0
    probe = 'source "$1" 2>/dev/null; _describe() { print -l ${(P)2} }; '
    probe += "_shtab_execgate_rules_commands"
    listed = subprocess.run(
        ["zsh", "-c", probe, "zsh", str(script)], capture_output=True, text=True
    )
    assert listed.stdout.split("\n")[0].startswith("explain:"), listed


def test_unknown_shell_is_a_usage_error(world: World) -> None:
    done = world.run("completion", "tcsh")
    assert done.returncode == 2 and "invalid choice: 'tcsh'" in done.stderr


# --- execgate run: statuses and messages ----------------------------------------------------


def test_a_command_that_cannot_run_exits_126_and_a_missing_one_127(world: World) -> None:
    script = world.work / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")  # no x bit
    line = one_error(world.run("run", "--", "./script.sh"), status=126)
    assert line == (
        f"execgate: error: {script}: Permission denied (the program descriptor is not executable)"
    )
    line = one_error(world.run("run", "--", "./missing"), status=127)
    assert line == f"execgate: error: {world.work}/missing: No such file or directory"
    line = one_error(world.run("run", "--", "no-such-command-xyz"), status=127)
    assert line == "execgate: error: no-such-command-xyz: command not found"


def test_non_utf8_arguments_are_shown_shell_quoted(world: World) -> None:
    rules = world.work / "r.rules"
    rules.write_text('prefix_rule(["date", "--publish"], "prompt", justification="it publishes")\n')
    weird = os.fsdecode(b"caf\xe9")
    # the session's own command (judged in Python) and a child exec (judged in C)
    own = world.run("run", "--on-prompt", "deny", "--rules", str(rules), "--", "date",
                    "--publish", weird)  # fmt: skip
    child = world.run("run", "--on-prompt", "deny", "--rules", str(rules), "--", "bash", "-c",
                      "date --publish $'caf\\xe9'")  # fmt: skip
    for done in (own, child):
        assert done.returncode == 126
        assert "execgate: denied: date --publish $'caf\\xe9': it publishes;" in done.stderr
        assert "udce9" not in done.stderr
    missing = one_error(world.run("run", "--", "./" + weird), status=127)
    assert missing == f"execgate: error: $'{world.work}/caf\\xe9': No such file or directory"


def test_on_prompt_deny_says_how_to_allow(world: World) -> None:
    rules = world.work / "r.rules"
    rules.write_text('prefix_rule(["date", "--publish"], "prompt", justification="it publishes")\n')
    done = world.run("run", "--on-prompt", "deny", "--rules", str(rules), "--", "bash", "-c",
                     "date --publish now; echo rc=$?")  # fmt: skip
    assert done.stdout == "rc=126\n"
    assert (
        "execgate: denied: date --publish now: it publishes; prompts are set to deny "
        '(--on-prompt deny); to allow it, add prefix_rule(pattern=["date", "--publish"], '
        'decision="allow") to your rules'
    ) in done.stderr
